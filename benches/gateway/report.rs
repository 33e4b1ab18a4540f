//! The markdown table and the verdicts against issue 3's targets, from the results JSON.

use serde_json::Value;

use crate::lineup::Target;

fn at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter().try_fold(v, |v, k| v.get(*k))
}

fn num(v: &Value, path: &[&str]) -> Option<f64> {
    at(v, path).and_then(Value::as_f64)
}

fn f(x: Option<f64>, decimals: usize) -> String {
    x.map_or("–".into(), |x| format!("{x:.decimals$}"))
}

fn pair(a: Option<f64>, b: Option<f64>, decimals: usize) -> String {
    if a.is_none() && b.is_none() {
        return "–".into();
    }
    format!("{} / {}", f(a, decimals), f(b, decimals))
}

/// The `what` counts of a limits run, most frequent first.
fn what(v: Option<&Value>) -> String {
    let Some(Value::Object(m)) = v else {
        return "–".into();
    };
    let mut items: Vec<(&String, u64)> = m
        .iter()
        .map(|(k, v)| (k, v.as_u64().unwrap_or(0)))
        .collect();
    items.sort_by_key(|item| std::cmp::Reverse(item.1));
    items
        .iter()
        .map(|(k, n)| format!("{n}× {k}"))
        .collect::<Vec<_>>()
        .join(", ")
}

struct Table {
    cols: Vec<String>,
    rows: Vec<(String, Vec<String>)>,
}

impl Table {
    fn render(&self) -> String {
        let mut s = format!("| measure | {} |\n|---|", self.cols.join(" | "));
        s.push_str(&"---|".repeat(self.cols.len()));
        s.push('\n');
        for (name, cells) in &self.rows {
            s.push_str(&format!("| {name} | {} |\n", cells.join(" | ")));
        }
        s
    }
}

pub fn markdown(doc: &Value, verdicts: bool) -> String {
    let targets: Vec<String> = at(doc, &["meta", "targets"])
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|t| t.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    let s = |path: &[&str]| at(doc, &[&["scenarios"], path].concat()).cloned();
    let mut t = Table {
        cols: targets.clone(),
        rows: Vec::new(),
    };
    let mut row = |name: String, cell: &dyn Fn(&str) -> String| {
        let cells = targets.iter().map(|x| cell(x)).collect();
        t.rows.push((name, cells));
    };
    let err_or = |v: Option<&Value>, ok: String| -> String {
        match v.and_then(|v| v.get("error")) {
            Some(_) => "failed".into(),
            None => ok,
        }
    };

    if let Some(ns) = s(&["nonstream"]) {
        let conns = num(&ns, &["params", "connections"]).unwrap_or(0.0);
        let tv = |x: &str| ns.get("targets").and_then(|m| m.get(x)).cloned();
        let bytes = targets
            .iter()
            .find_map(|x| tv(x).and_then(|v| num(&v, &["answer_bytes"])))
            .unwrap_or(0.0);
        row(
            format!(
                "**non-streaming** {bytes:.0} B answers, {conns:.0} keep-alive conns: requests/s"
            ),
            &|x| tv(x).map_or("–".into(), |v| err_or(Some(&v), f(num(&v, &["rps"]), 0))),
        );
        row("↳ latency p50 / p99 (ms)".into(), &|x| {
            tv(x).map_or("–".into(), |v| {
                pair(
                    num(&v, &["latency", "p50_ms"]),
                    num(&v, &["latency", "p99_ms"]),
                    3,
                )
            })
        });
        row(
            "↳ gateway CPU per request (µs) / gateway core busy".into(),
            &|x| {
                tv(x).map_or("–".into(), |v| {
                    if x == "direct" {
                        return "–".into();
                    }
                    format!(
                        "{} / {}%",
                        f(num(&v, &["gateway_cpu_us_per_request"]), 1),
                        f(num(&v, &["gateway_cpu_util"]).map(|u| u * 100.0), 0)
                    )
                })
            },
        );
        row("↳ load core busy (client + fake)".into(), &|x| {
            tv(x).map_or("–".into(), |v| {
                format!("{}%", f(num(&v, &["load_core_util"]).map(|u| u * 100.0), 0))
            })
        });
    }

    if let Some(st) = s(&["streams"]) {
        let p = |k: &str| num(&st, &["params", k]).unwrap_or(0.0);
        let tv = |x: &str| st.get("targets").and_then(|m| m.get(x)).cloned();
        row(
            format!(
                "**{:.0} streams × {:.0} chunks @ {:.0} ms**: per-chunk one-way latency p50 / p99 (ms)",
                p("streams"),
                p("chunks"),
                p("interval_ms")
            ),
            &|x| {
                tv(x).map_or("–".into(), |v| {
                    err_or(
                        Some(&v),
                        pair(num(&v, &["latency", "p50_ms"]), num(&v, &["latency", "p99_ms"]), 3),
                    )
                })
            },
        );
        row("↳ added vs direct p50 / p99 (ms)".into(), &|x| {
            if x == "direct" {
                return "–".into();
            }
            tv(x).map_or("–".into(), |v| {
                pair(num(&v, &["added_p50_ms"]), num(&v, &["added_p99_ms"]), 3)
            })
        });
        row(
            format!(
                "↳ p99 (ms): each stream's first {} chunks (behind the other streams' setup) / the rest",
                crate::scenarios::SETUP_CHUNKS
            ),
            &|x| {
                tv(x).map_or("–".into(), |v| {
                    pair(
                        num(&v, &["setup_latency", "p99_ms"]),
                        num(&v, &["steady_latency", "p99_ms"]),
                        3,
                    )
                })
            },
        );
        row("↳ chunks coalesced / streams incomplete".into(), &|x| {
            tv(x).map_or("–".into(), |v| {
                pair(num(&v, &["coalesced"]), num(&v, &["incomplete_streams"]), 0)
            })
        });
        row(
            "↳ gateway CPU per 1,000 chunks here (ms, incl. stream setup)".into(),
            &|x| {
                tv(x).map_or("–".into(), |v| {
                    f(num(&v, &["gateway_cpu_ms_per_1000_chunks"]), 1)
                })
            },
        );
    }

    if let Some(lv) = s(&["leave"]) {
        let n = num(&lv, &["params", "streams"]).unwrap_or(0.0);
        let every = num(&lv, &["params", "interval_ms"]).unwrap_or(0.0);
        for (kind, label) in [
            ("mid_stream", "mid-stream"),
            ("frozen_upstream", "upstream frozen"),
            ("before_first_token", "before the first token"),
        ] {
            let tv = |x: &str| at(&lv, &["kinds", kind, x]).cloned();
            row(
                format!("**{n:.0} clients leave {label}** (a chunk every {every:.0} ms): close → upstream close p50 / p99 (ms); zombies"),
                &|x| {
                    tv(x).map_or("–".into(), |v| {
                        err_or(
                            Some(&v),
                            format!(
                                "{}; {}",
                                pair(
                                    num(&v, &["close_to_upstream_close", "p50_ms"]),
                                    num(&v, &["close_to_upstream_close", "p99_ms"]),
                                    2
                                ),
                                f(num(&v, &["zombies"]), 0)
                            ),
                        )
                    })
                },
            );
        }
    }

    if let Some(mem) = s(&["memory"]) {
        if let Some(Value::Object(sizes)) = mem.get("sizes") {
            let mut sizes: Vec<(&String, &Value)> = sizes.iter().collect();
            sizes.sort_by_key(|(k, _)| k.parse::<u64>().unwrap_or(0));
            for (n, v) in sizes {
                row(
                    format!("**RSS per stream**, {n} concurrent slow streams (KiB)"),
                    &|x| {
                        if x == "direct" {
                            return "–".into();
                        }
                        v.get(x).map_or("–".into(), |v| {
                            let live = num(v, &["live_streams"]).unwrap_or(0.0);
                            let want = num(v, &["streams"]).unwrap_or(0.0);
                            let note = if live < want {
                                format!(" ({live:.0} live)")
                            } else {
                                String::new()
                            };
                            err_or(
                                Some(v),
                                format!("{}{note}", f(num(v, &["rss_per_stream_kib"]), 1)),
                            )
                        })
                    },
                );
            }
        }
    }

    if let Some(lim) = s(&["limits"]) {
        let ms = num(&lim, &["params", "limit_ms"]).unwrap_or(0.0);
        for (kind, label) in [
            ("idle", "idle limit"),
            ("first_token_head_sent", "first-token limit, head sent"),
            ("first_token_head_held", "first-token limit, head held"),
        ] {
            row(
                format!("**{label} {ms:.0} ms**: client sees the end after p50 / max (ms); what"),
                &|x| {
                    if x == "direct" {
                        return "–".into();
                    }
                    at(&lim, &["targets", x]).map_or("–".into(), |v| {
                        if v.get("error").is_some() {
                            return "failed".into();
                        }
                        format!(
                            "{}; {}",
                            pair(
                                num(v, &[kind, "end_seen_after", "p50_ms"]),
                                num(v, &[kind, "end_seen_after", "max_ms"]),
                                1
                            ),
                            what(at(v, &[kind, "what"]))
                        )
                    })
                },
            );
        }
        row(
            "↳ gateway CPU per stream, its setup and its end (µs; the streams start together)"
                .into(),
            &|x| {
                at(&lim, &["targets", x]).map_or("–".into(), |v| {
                    f(num(v, &["gateway_cpu_us_per_stream"]), 0)
                })
            },
        );
    }

    if let Some(cpu) = s(&["cpu"]) {
        let p = |k: &str| num(&cpu, &["params", k]).unwrap_or(0.0);
        row(
            format!(
                "**CPU per 1,000 chunks** ({:.0} streams × {:.0} chunks @ {:.0} ms): gateway user+sys (ms)",
                p("streams"),
                p("chunks"),
                p("interval_ms")
            ),
            &|x| {
                if x == "direct" {
                    return "–".into();
                }
                at(&cpu, &["targets", x]).map_or("–".into(), |v| {
                    err_or(Some(v), f(num(v, &["gateway_cpu_ms_per_1000_chunks"]), 2))
                })
            },
        );
    }

    let meta = &doc["meta"];
    let mut out = format!(
        "## Results ({} run, {})\n\n{}; {} CPUs, {} GiB; kernel {}; Debian {}. Load generator and fake \
         provider pinned to CPU {}, each gateway to CPU {}, all at {}. Versions: hourglass {}, {}, {}{}. \
         Whole run: {:.0} s.\n\n",
        meta["mode"].as_str().unwrap_or(""),
        meta["date"].as_str().unwrap_or(""),
        meta["machine"]["cpu"].as_str().unwrap_or(""),
        meta["machine"]["cpus"],
        meta["machine"]["memory_gib"],
        meta["machine"]["kernel"].as_str().unwrap_or(""),
        meta["machine"]["debian"].as_str().unwrap_or(""),
        meta["load_core"],
        meta["gateway_core"],
        meta["scheduling"].as_str().unwrap_or("?"),
        meta["versions"]["hourglass"].as_str().unwrap_or(""),
        meta["versions"]["nginx"].as_str().unwrap_or("nginx absent"),
        meta["versions"]["haproxy"].as_str().unwrap_or("haproxy absent"),
        ["litellm", "portkey"]
            .iter()
            .filter_map(|p| meta["versions"][p].as_str().map(|v| format!(", {p} {v}")))
            .collect::<String>(),
        meta["duration_s"].as_f64().unwrap_or(0.0),
    );
    out.push_str(&t.render());
    if verdicts {
        out.push('\n');
        out.push_str(&verdict_table(doc, &targets));
    } else {
        out.push_str(
            "\nQuick run: sizes too small for the targets to mean anything; no verdicts.\n",
        );
    }
    out
}

/// One line per target of the issue, for each Hourglass variant measured.
fn verdict_table(doc: &Value, targets: &[String]) -> String {
    let sc = &doc["scenarios"];
    // Issue 3's targets are set against nginx and haproxy. LiteLLM and Portkey are in the
    // table above; here a peer that left every stream running would have no close latency
    // at all and pass for the best one.
    let peers: Vec<&str> = targets
        .iter()
        .map(String::as_str)
        .filter(|t| Target::from_name(t).is_some_and(|t| t.is_peer() && !t.is_llm_peer()))
        .collect();
    let ours: Vec<&str> = targets
        .iter()
        .map(String::as_str)
        .filter(|t| Target::from_name(t).is_some_and(Target::is_hourglass))
        .collect();
    // The bare hyper proxies: what any gateway on the mandated stack starts from.
    let floor: Vec<&str> = targets
        .iter()
        .map(String::as_str)
        .filter(|t| Target::from_name(t).is_some_and(Target::is_bare))
        .collect();
    if ours.is_empty() {
        return String::new();
    }
    let mut rows: Vec<String> = Vec::new();
    let best_of = |set: &[&str], get: &dyn Fn(&str) -> Option<f64>, max: bool| -> Option<f64> {
        let vals = set.iter().filter_map(|p| get(p));
        if max {
            vals.fold(None, |a: Option<f64>, v| Some(a.map_or(v, |a| a.max(v))))
        } else {
            vals.fold(None, |a: Option<f64>, v| Some(a.map_or(v, |a| a.min(v))))
        }
    };
    let best = |get: &dyn Fn(&str) -> Option<f64>, max: bool| best_of(&peers, get, max);
    // (target, value and verdict per ours, best peer, best bare proxy)
    let mut line = |goal: &str,
                    get: &dyn Fn(&str) -> Option<f64>,
                    decimals: usize,
                    check: &dyn Fn(f64, Option<f64>) -> Option<bool>,
                    max: bool| {
        let best_v = best(get, max);
        let floor_v = best_of(&floor, get, max);
        let mut cells = Vec::new();
        for o in &ours {
            let v = get(o);
            let verdict = match v.and_then(|v| check(v, best_v)) {
                Some(true) => "**met**",
                Some(false) => "**missed**",
                None => "n/a",
            };
            cells.push(format!("{} {verdict}", f(v, decimals)));
        }
        rows.push(format!(
            "| {goal} | {} | {} | {} |",
            cells.join(" | "),
            f(best_v, decimals),
            f(floor_v, decimals)
        ));
    };
    let ge = |v: f64, b: Option<f64>| b.map(|b| v >= b);
    let le = |v: f64, b: Option<f64>| b.map(|b| v <= b);
    let lt = |v: f64, b: Option<f64>| b.map(|b| v < b);

    let rps = |t: &str| num(sc, &["nonstream", "targets", t, "rps"]);
    line(
        "non-streaming: requests/s ≥ best peer's",
        &rps,
        0,
        &ge,
        true,
    );
    let p99 = |t: &str| num(sc, &["nonstream", "targets", t, "latency", "p99_ms"]);
    line("non-streaming: p99 (ms) ≤ best peer's", &p99, 3, &le, false);
    let added = |t: &str| num(sc, &["streams", "targets", t, "added_p99_ms"]);
    let quarter = |v: f64, _: Option<f64>| Some(v <= 0.25);
    line(
        "streams: added p99 per chunk ≤ 0.25 ms",
        &added,
        3,
        &quarter,
        false,
    );
    let coalesced = |t: &str| num(sc, &["streams", "targets", t, "coalesced"]);
    let zero = |v: f64, _: Option<f64>| Some(v == 0.0);
    line("streams: no chunk coalesced", &coalesced, 0, &zero, false);
    for kind in ["mid_stream", "frozen_upstream", "before_first_token"] {
        let p99 = move |t: &str| {
            num(
                sc,
                &[
                    "leave",
                    "kinds",
                    kind,
                    t,
                    "close_to_upstream_close",
                    "p99_ms",
                ],
            )
        };
        let one = |v: f64, _: Option<f64>| Some(v <= 1.0);
        line(
            &format!("leave {kind}: close → upstream close p99 ≤ 1 ms"),
            &p99,
            2,
            &one,
            false,
        );
        let z = move |t: &str| num(sc, &["leave", "kinds", kind, t, "zombies"]);
        line(
            &format!("leave {kind}: 0 zombies 2 s later"),
            &z,
            0,
            &zero,
            false,
        );
    }
    if let Some(Value::Object(sizes)) = sc.get("memory").and_then(|m| m.get("sizes")) {
        let mut keys: Vec<&String> = sizes.keys().collect();
        keys.sort_by_key(|k| k.parse::<u64>().unwrap_or(0));
        for n in keys {
            let per = |t: &str| num(&sizes[n], &[t, "rss_per_stream_kib"]);
            line(
                &format!("RSS per stream at {n} streams (KiB) < best peer's"),
                &per,
                1,
                &lt,
                false,
            );
        }
    }
    let cpu = |t: &str| num(sc, &["cpu", "targets", t, "gateway_cpu_ms_per_1000_chunks"]);
    line(
        "CPU per 1,000 chunks (ms) < best peer's",
        &cpu,
        2,
        &lt,
        false,
    );
    let limit_ms = num(sc, &["limits", "params", "limit_ms"]).unwrap_or(1000.0);
    for (kind, want) in [
        ("idle", "event: error idle_timeout"),
        ("first_token_head_sent", "event: error first_token_timeout"),
        ("first_token_head_held", "504 first_token_timeout"),
    ] {
        let max = move |t: &str| {
            num(
                sc,
                &["limits", "targets", t, kind, "end_seen_after", "max_ms"],
            )
        };
        let all_right = move |t: &str| {
            at(sc, &["limits", "targets", t, kind, "what"])
                .and_then(Value::as_object)
                .map(|m| m.len() == 1 && m.contains_key(want))
        };
        let mut cells = Vec::new();
        for o in &ours {
            let v = max(o);
            let ok = v
                .map(|v| v <= limit_ms + 20.0)
                .zip(all_right(o))
                .map(|(a, b)| a && b);
            let verdict = match ok {
                Some(true) => "**met**",
                Some(false) => "**missed**",
                None => "n/a",
            };
            cells.push(format!("{} {verdict}", f(v, 1)));
        }
        rows.push(format!(
            "| limits {kind}: end seen within {limit_ms:.0} + 20 ms (max), as `{want}` | {} | {} | – |",
            cells.join(" | "),
            f(best(&max, false), 1)
        ));
    }

    let mut s = format!(
        "### Targets of issue 3\n\n| target | {} | best peer | bare hyper (floor) |\n|---|{}---|---|\n",
        ours.join(" | "),
        "---|".repeat(ours.len())
    );
    for r in rows {
        s.push_str(&r);
        s.push('\n');
    }
    s
}

//! Running out of file descriptors: the open-file limit the process starts with, and what the
//! gateway still answers when its descriptors are all in use. These run the binary in a
//! process of its own, whose limit a test may set without touching its neighbours'.

use crate::support::*;
use hourglass_fake::FakeUpstream;

fn config(fake: &FakeUpstream) -> String {
    format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n\n\
         [upstreams.fake]\nurl = \"{}\"\nauth = \"none\"\n\n\
         [[routes]]\nname = \"chat\"\npath_prefix = \"/v1/chat/completions\"\nupstream = \"fake\"\n",
        fake.url()
    )
}

/// The hard open-file limit of this (test) process, which a child's may not exceed.
fn hard_limit() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes only the struct it is given.
    assert_eq!(
        unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) },
        0
    );
    limit.rlim_max
}

/// Audit KF 6: a soft limit below the hard one (systemd's default `LimitNOFILE=1024:524288`)
/// is raised to the hard one at start, and both are logged.
#[tokio::test]
async fn the_soft_open_file_limit_is_raised_to_the_hard_one_at_start() {
    let fake = FakeUpstream::start("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let hard = hard_limit().min(8192);
    assert!(hard > 256, "this test needs a hard limit above 256: {hard}");
    let p = Process::spawn_with_nofile(&config(&fake), &[], &[], Some((256, hard))).await;
    assert_eq!(p.nofile(), (hard, hard));
    let (out, err) = p.output();
    let text = format!("{out}{err}");
    let line = text
        .lines()
        .find(|l| l.contains("open-file limit"))
        .unwrap_or_else(|| panic!("no open-file limit line:\n{text}"));
    assert!(
        line.contains("256") && line.contains(&hard.to_string()),
        "{line}"
    );
    p.stop().await;
}

//! Fingerprints the run store compares: the same on every replica and across restarts (a
//! fixed function of the bytes, not the process's randomly keyed hasher), and cheap enough
//! to take of every request body of a run that stops loops.

/// A 64-bit fingerprint of `bytes`: FNV-1a's multiply over eight bytes at a time, with a final
/// avalanche (murmur3's) so that nearby inputs spread over all 64 bits. Not a cryptographic
/// hash: it tells repeats apart, it does not stand up to someone crafting collisions, who
/// could at most make their own run look like a loop.
pub fn of(bytes: &[u8]) -> u64 {
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ bytes.len() as u64;
    let mut words = bytes.chunks_exact(8);
    for w in &mut words {
        let w = u64::from_le_bytes(w.try_into().expect("eight bytes"));
        h = (h ^ w).wrapping_mul(PRIME).rotate_left(23);
    }
    for &b in words.remainder() {
        h = (h ^ u64::from(b)).wrapping_mul(PRIME);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

#[cfg(test)]
mod tests {
    use super::of;

    #[test]
    fn stable_and_spread() {
        // A fixed function: the same value in every process, on every replica.
        assert_eq!(of(b"abc"), of(b"abc"));
        assert_eq!(of(b""), of(b""));
        let values: std::collections::HashSet<u64> = (0..10_000u32)
            .map(|i| of(format!("{{\"user\":\"turn {i}\"}}").as_bytes()))
            .collect();
        assert_eq!(values.len(), 10_000, "no collision among near inputs");
        assert_ne!(of(b"abcdefgh"), of(b"abcdefgi"));
        assert_ne!(of(b"a"), of(b"a\0"));
    }
}

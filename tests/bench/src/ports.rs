//! Free loopback ports picked at run time (other engineers' clusters share this machine).

use std::net::TcpListener;

/// `len` consecutive ports on 127.0.0.1 that are free now (each one binds), from a
/// pseudo-random start in 20000..32000 (below Linux's ephemeral range, so outgoing connections
/// do not take them meanwhile).
pub fn free_port_block(len: u16) -> anyhow::Result<u16> {
    use rand::Rng;
    let mut rng = rand::thread_rng();
    for _ in 0..200 {
        let start: u16 = rng.gen_range(20_000..32_000 - len);
        let all_free = (start..start + len).all(|p| TcpListener::bind(("127.0.0.1", p)).is_ok());
        if all_free {
            return Ok(start);
        }
    }
    anyhow::bail!("no block of {len} free ports on 127.0.0.1 in 20000..32000")
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_block_is_free_and_in_range() {
        let start = free_port_block(9).unwrap();
        assert!((20_000..32_000 - 9).contains(&start));
        for p in start..start + 9 {
            // Free when picked; nothing here takes them in between.
            let l = TcpListener::bind(("127.0.0.1", p)).unwrap();
            drop(l);
        }
    }
}

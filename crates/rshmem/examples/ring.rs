//! Ring exchange: every PE puts a block of words into the next PE's buffer with a signal, waits
//! for the block from the previous PE, and checks it word by word.
//!
//! ```text
//! cargo run --release -p rshmem --example ring          # 4 PEs as threads
//! RSHMEM_PES=8 cargo run --release -p rshmem --example ring
//! ```

use rshmem::{Cmp, Signal};

const WORDS: usize = 4096;

/// The word `i` that PE `pe` sends.
fn word(pe: usize, i: usize) -> u64 {
    ((pe as u64) << 32) | i as u64
}

fn main() -> std::process::ExitCode {
    let results = rshmem::launch(4, |pe| -> Result<String, String> {
        let run = || -> rshmem::Result<Result<String, String>> {
            let (me, n) = (pe.my_pe(), pe.n_pes());
            let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
            let buf = pe.alloc::<u64>(WORDS)?;
            let sig = pe.alloc::<u64>(1)?;
            pe.local_fill(&buf, u64::MAX)?; // poison: a missing word shows
            pe.barrier_all()?;

            let mine: Vec<u64> = (0..WORDS).map(|i| word(me, i)).collect();
            pe.put_signal(&buf, 0, &mine, Signal::set(&sig, 0, 1), next)?;
            pe.wait_until(&sig, 0, Cmp::Eq, 1)?;

            let got = pe.local_vec(&buf)?;
            let bad = (0..WORDS).find(|&i| got[i] != word(prev, i));
            pe.barrier_all()?;
            pe.free(sig)?;
            pe.free(buf)?;
            Ok(match bad {
                None => Ok(format!(
                    "PE {me} of {n}: received {WORDS} words from PE {prev}, all correct"
                )),
                Some(i) => Err(format!(
                    "PE {me} of {n}: word {i} from PE {prev} is {:#x}, expected {:#x}",
                    got[i],
                    word(prev, i)
                )),
            })
        };
        run().unwrap_or_else(|e| Err(format!("PE {}: {e}", pe.my_pe())))
    })
    .values();
    let results = match results {
        Ok(r) => r,
        Err(e) => {
            eprintln!("ring: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let mut ok = true;
    for r in results {
        match r {
            Ok(line) => println!("{line}"),
            Err(line) => {
                eprintln!("{line}");
                ok = false;
            }
        }
    }
    if ok {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    }
}

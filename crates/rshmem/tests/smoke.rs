use rshmem::*;
use std::time::Duration;

fn cfg() -> Config {
    Config::default()
        .heap_size(1 << 20)
        .timeout(Duration::from_secs(20))
}

#[test]
fn ring_put_get() {
    for n in [1, 2, 3, 8] {
        let r = rshmem::Launch::new()
            .config(cfg())
            .threads()
            .run(n, |pe| -> Result<Vec<u32>> {
                let x = pe.alloc::<u32>(5)?;
                pe.local_fill(&x, 0xdead)?;
                pe.barrier_all()?;
                let next = (pe.my_pe() + 1) % pe.n_pes();
                pe.put(&x, 1, &[pe.my_pe() as u32; 3], next)?;
                pe.barrier_all()?;
                let v = pe.local_vec(&x)?;
                pe.free(x)?;
                Ok(v)
            })
            .values()
            .unwrap();
        for (i, v) in r.into_iter().enumerate() {
            let prev = ((i + n - 1) % n) as u32;
            assert_eq!(v.unwrap(), vec![0xdead, prev, prev, prev, 0xdead]);
        }
    }
}

#[test]
fn alloc_mismatch_detected() {
    let r = rshmem::Launch::new()
        .config(cfg())
        .threads()
        .run(3, |pe| {
            pe.alloc::<u8>(if pe.my_pe() == 1 { 10 } else { 20 })
                .map(|_| ())
        })
        .values()
        .unwrap();
    for (p, x) in r.into_iter().enumerate() {
        // PE 1 names PE 0, the others name PE 1
        let other = usize::from(p != 1);
        assert!(
            matches!(x, Err(Error::CollectiveMismatch { op: "alloc", pe, .. }) if pe == other),
            "PE {p}: {x:?}"
        );
    }
}

type Pair = Option<(usize, usize)>;

#[test]
fn teams_split() {
    let r = rshmem::Launch::new()
        .config(cfg())
        .threads()
        .run(6, |pe| -> Result<(Pair, Pair)> {
            let w = pe.world_team();
            let odd = pe.team_split_strided(w, 1, 2, 3)?;
            let col = pe.team_split(w, Some((pe.my_pe() % 3) as u32), -(pe.my_pe() as i64))?;
            if let Some(t) = &odd {
                pe.team_barrier(t)?;
            }
            if let Some(t) = &col {
                pe.team_barrier(t)?;
            }
            let a = odd.as_ref().map(|t| (t.my_pe(), t.n_pes()));
            let b = col.as_ref().map(|t| (t.my_pe(), t.n_pes()));
            if let Some(t) = odd {
                pe.team_destroy(t)?;
            }
            if let Some(t) = col {
                pe.team_destroy(t)?;
            }
            Ok((a, b))
        })
        .values()
        .unwrap();
    let r: Vec<_> = r.into_iter().map(|x| x.unwrap()).collect();
    // odd PEs 1, 3, 5 in order; colors {0,3},{1,4},{2,5}, ordered by descending PE (key = -pe)
    let want: Vec<(Pair, Pair)> = (0..6)
        .map(|p| {
            let odd = (p % 2 == 1).then_some((p / 2, 3));
            (odd, Some((usize::from(p < 3), 2)))
        })
        .collect();
    assert_eq!(r, want);
}

#[path = "harness/mod.rs"]
mod harness;

fn ring_body(pe: &Pe) -> Result<()> {
    let n = pe.n_pes();
    let x = pe.alloc::<f32>(17)?;
    pe.local_fill(&x, f32::NAN)?;
    pe.barrier_all()?;
    let data: Vec<f32> = harness::rand_vec(pe.my_pe(), 1, 17);
    pe.put(&x, 0, &data, (pe.my_pe() + 1) % n)?;
    pe.barrier_all()?;
    let want: Vec<f32> = harness::rand_vec((pe.my_pe() + n - 1) % n, 1, 17);
    assert_eq!(pe.local_vec(&x)?, want);
    pe.free(x)
}

mode_test!(ring_all_modes, [1, 2, 3], ring_body);

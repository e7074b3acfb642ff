//! Calibration input: records grouped by size at their median, later files winning, run
//! filters; the error table.

use rshmem_sim::calibrate::{is_training, load_cases, table, tokens_of, Case, Row};

fn record(op: &str, bytes: usize, t: f64, run: &str) -> String {
    format!(
        r#"{{"op":"{op}","backend":"cuda","pes":2,"bytes":{bytes},"time_us":{t},"note":"ll","run":"{run}"}}"#
    )
}

#[test]
fn cases_from_perf_json() {
    let dir = std::env::temp_dir().join(format!("rshmem-sim-cal-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let a = dir.join("a.json");
    let b = dir.join("b.json");
    let recs = [
        record("all_reduce", 8, 3.0, "x1"),
        record("all_reduce", 8, 5.0, "x2"),
        record("all_to_all", 8, 9.0, "x1"),
        record("put", 8, 1.0, "x1"),
    ];
    std::fs::write(&a, format!("[{}]", recs.join(","))).expect("write");
    let recs = [
        record("all_to_all", 8, 4.0, "keep"),
        record("all_to_all", 8, 40.0, "drop"),
    ];
    std::fs::write(&b, format!("[{}]", recs.join(","))).expect("write");
    let a = a.to_string_lossy().to_string();
    let b = format!("{}@keep", b.to_string_lossy());
    let cases = load_cases(&[a.clone(), b.clone()]).expect("cases");
    assert!(cases.iter().all(|c| !c.superseded));
    // `!all_reduce:ll` on the first file: its all_reduce records on ll time replaced kernels.
    let old = load_cases(&[format!("{a}!all_reduce:ll"), b]).expect("cases");
    let flags: Vec<(String, bool)> = old.iter().map(|c| (c.op.clone(), c.superseded)).collect();
    assert_eq!(
        flags,
        [
            ("all_reduce".to_string(), true),
            ("all_to_all".to_string(), false)
        ]
    );
    let got: Vec<(String, f64, usize)> = cases
        .iter()
        .map(|c| (c.op.clone(), c.time_us, c.runs))
        .collect();
    assert_eq!(
        got,
        [
            ("all_reduce".to_string(), 4.0, 2),
            ("all_to_all".to_string(), 4.0, 1)
        ]
    );
    assert!(is_training(&cases[0]));
    std::fs::remove_dir_all(&dir).expect("clean");
}

/// MoE records without a note: graph replays and layout from the mode, T from the bytes.
#[test]
fn noteless_moe_records() {
    // rshmem perf's 2x and 4x H200 runs (T = 4096 and 128, H = 7168, k = 8, E = 256).
    assert_eq!(tokens_of(58_476_544, 2), 4096);
    assert_eq!(tokens_of(1_835_008, 2), 128);
    assert_eq!(tokens_of(158_613_504, 4), 4096);
    assert_eq!(tokens_of(4_902_912, 4), 128);
    assert_eq!(tokens_of(0, 2), 0);
    let dir = std::env::temp_dir().join(format!("rshmem-sim-noteless-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let a = dir.join("a.json");
    let rec = |mode: &str, t: f64| {
        format!(
            r#"{{"op":"ep_dispatch","backend":"cuda","mode":"{mode}","pes":2,"bytes":1835008,"time_us":{t},"run":"r"}}"#
        )
    };
    let recs = [
        rec("normal", 1.0),
        rec("normal+tokens", 2.0),
        rec("capturable", 3.0),
        rec("capturable+tokens", 4.0),
    ];
    std::fs::write(&a, format!("[{}]", recs.join(","))).expect("write");
    let cases = load_cases(&[a.to_string_lossy().to_string()]).expect("cases");
    assert_eq!(cases.len(), 2);
    for (c, (token_major, t)) in cases.iter().zip([(false, 3.0), (true, 4.0)]) {
        assert_eq!((c.tokens, c.ep), (128, (7168, 8, 256)));
        assert_eq!((c.token_major, c.time_us), (token_major, t));
    }
    std::fs::remove_dir_all(&dir).expect("clean");
}

#[test]
fn error_table() {
    let case = |op: &str, bytes| Case {
        op: op.to_string(),
        pes: 2,
        bytes,
        tokens: 0,
        ep: (0, 0, 0),
        token_major: false,
        time_us: 10.0,
        note: "ll".to_string(),
        runs: 1,
        superseded: false,
    };
    let row = |c: Case, error: f64, stale| Row {
        train: is_training(&c),
        case: c,
        sim_us: 10.0 * (1.0 + error),
        path: "ll".to_string(),
        error,
        stale,
    };
    let rows = [
        row(case("all_gather", 8), 0.10, false),
        row(case("all_gather", 16), -0.02, false),
        row(case("all_gather", 32), 0.04, false),
        row(case("all_gather", 64), 0.5, true),
        row(case("all_reduce", 8), 0.01, false),
    ];
    assert_eq!(
        table(&rows),
        "| op | GPUs | validation cases | median abs. error | max abs. error | fit cases | median | max | left out (path or kernel changed) |\n\
         | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n\
         | all_gather | 2 | 3 | 4.0 % | 10.0 % | 0 | – | – | 1 |\n\
         | all_reduce | 2 | 0 | – | – | 1 | 1.0 % | 1.0 % | 0 |\n"
    );
}

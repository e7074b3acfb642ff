//! One measured figure, as printed in the table and written by `--json`.

use serde::{Deserialize, Serialize};

/// One figure of `rshmem perf` beside its same-run baseline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// Operation: put, get, put_signal, fetch_add, barrier (later suites add theirs).
    pub op: String,
    /// API flavour: host, stream or device.
    pub api: String,
    /// Backend name: shm, cuda.
    pub backend: String,
    /// PE placement: threads, processes, mixed (CUDA MoE records: the EP mode, normal or
    /// capturable, of thread-PEs).
    pub mode: String,
    /// PEs in the world that ran it.
    pub pes: usize,
    /// Payload bytes per operation.
    pub bytes: usize,
    /// Operations timed (all samples together, warm-up excluded).
    pub iters: u64,
    /// Median time of one operation in microseconds (one-way for ping-pong latencies).
    pub time_us: f64,
    /// Bandwidth `bytes / time` in GB/s (10^9 bytes per second); 0 for pure latencies.
    pub gbps: f64,
    /// Name of the baseline measured in the same run.
    pub baseline: String,
    /// Median time of one baseline operation in microseconds.
    pub baseline_time_us: f64,
    /// `baseline_time_us / time_us`: above 1 means faster than the baseline.
    pub ratio: f64,
    /// Collectives: nccl-tests' bus bandwidth in GB/s (`gbps` is then the algorithm
    /// bandwidth); absent for other operations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub busbw_gbps: Option<f64>,
    /// How the figure was measured (one line).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub note: String,
}

/// Kind of figure, for the table and the plot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Bytes moved: report GB/s.
    Bandwidth,
    /// A latency: report microseconds.
    Latency,
}

impl Record {
    /// Ping-pongs and barriers are latencies; everything else (put, get, collectives, MoE
    /// dispatch/combine, device copies) moves a payload.
    pub fn kind(&self) -> Kind {
        match self.op.as_str() {
            "put_signal" | "fetch_add" | "barrier" | "device_put_signal" | "device_barrier" => {
                Kind::Latency
            }
            _ if self.bytes == 0 => Kind::Latency,
            _ => Kind::Bandwidth,
        }
    }

    /// Fills `gbps` and `ratio` from the times.
    pub fn finish(mut self) -> Self {
        self.gbps = if self.kind() == Kind::Bandwidth && self.time_us > 0.0 {
            self.bytes as f64 / (self.time_us * 1e3)
        } else {
            0.0
        };
        self.ratio = if self.time_us > 0.0 {
            self.baseline_time_us / self.time_us
        } else {
            0.0
        };
        self
    }
}

/// Errors of the command-line tool: library errors and failed data checks.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// Result of the command-line tool.
pub type CliResult<T> = Result<T, BoxError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratio_and_bandwidth() {
        let r = Record {
            op: "put".into(),
            api: "host".into(),
            backend: "shm".into(),
            mode: "threads".into(),
            pes: 2,
            bytes: 1 << 20,
            iters: 10,
            time_us: 100.0,
            gbps: 0.0,
            baseline: "memcpy".into(),
            baseline_time_us: 90.0,
            ratio: 0.0,
            busbw_gbps: None,
            note: String::new(),
        }
        .finish();
        assert!((r.gbps - 10.48576).abs() < 1e-9);
        assert!((r.ratio - 0.9).abs() < 1e-12);
        let json = serde_json::to_string(&[&r]).unwrap();
        let back: Vec<Record> = serde_json::from_str(&json).unwrap();
        assert_eq!(back[0], r);
        for key in [
            "op",
            "api",
            "backend",
            "mode",
            "pes",
            "bytes",
            "iters",
            "time_us",
            "gbps",
            "baseline",
            "baseline_time_us",
            "ratio",
        ] {
            assert!(json.contains(&format!("\"{key}\":")), "{key} missing");
        }
    }
}

//! The FP8 reference: e4m3 (round to nearest even, saturating at 448) with one f32 scale per
//! 128 elements, as DeepEP lays them out, and the checks of an FP8 dispatch against it.

use super::reference::Step;
use rshmem::cuda::ep::{LlDispatch, LowLatencyBuffer};
use rshmem::{Pe, Result};

/// The value of e4m3 byte `b` (0x7f / 0xff: NaN).
pub fn e4m3_to_f32(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let (e, m) = ((b >> 3) & 0xf, b & 7);
    if e == 0xf && m == 7 {
        return f32::NAN;
    }
    let mag = if e == 0 {
        m as f32 * 2f32.powi(-9)
    } else {
        (1.0 + m as f32 / 8.0) * 2f32.powi(e as i32 - 7)
    };
    sign * mag
}

/// e4m3 of `v`: the nearest finite value (ties to the even code), 448 beyond it.
pub fn f32_to_e4m3(v: f32) -> u8 {
    let a = v.abs();
    let mut best = 0u8;
    let mut dist = f32::INFINITY;
    for code in 0u8..=0x7e {
        let d = (e4m3_to_f32(code) - a).abs();
        if d < dist || (d == dist && code & 1 == 0) {
            best = code;
            dist = d;
        }
    }
    if v.is_sign_negative() && best != 0 {
        best | 0x80
    } else {
        best
    }
}

/// One group's e4m3 bytes and scale (absolute maximum, at least 1e-4, over 448).
pub fn quantise(g: &[f32]) -> (Vec<u8>, f32) {
    let amax = g.iter().fold(0f32, |m, v| m.max(v.abs()));
    let scale = amax.max(1e-4) / 448.0;
    let inv = 1.0 / scale;
    (g.iter().map(|&v| f32_to_e4m3(v * inv)).collect(), scale)
}

/// Checks the FP8 rows and scales of `d` against the reference quantisation of each row's
/// source (exact bytes and scales) and the dequantised values against the rows (within e4m3's
/// rounding: 1/16 of the value, or half the smallest step of the group).
pub fn verify_rows(
    pe: &Pe,
    buf: &LowLatencyBuffer,
    d: &LlDispatch,
    st: &Step,
    want: &[Vec<(usize, usize)>],
) -> Result<()> {
    let c = *buf.config();
    let (h, nm) = (c.hidden, buf.expert_rows());
    let (q, sc) = buf.recv_x_fp8(d)?;
    let (q, sc) = (pe.local_vec(&q)?, pe.local_vec(&sc)?);
    for (e, er) in want.iter().enumerate() {
        for (r, &(s, t)) in er.iter().enumerate() {
            let x: Vec<f32> = st.x(s, &c)[t * h..(t + 1) * h]
                .iter()
                .map(|v| v.to_f32())
                .collect();
            let row = e * nm + r;
            for (g, chunk) in x.chunks(128).enumerate() {
                let (rq, rs) = quantise(chunk);
                let got_s = sc[row * (h / 128) + g];
                assert_eq!(
                    got_s,
                    rs,
                    "PE {} expert {e} row {r} group {g}: scale",
                    pe.my_pe()
                );
                for (i, (&b, &v)) in q[row * h + g * 128..].iter().zip(chunk).enumerate() {
                    assert_eq!(
                        b,
                        rq[i],
                        "PE {} expert {e} row {r} elem {}: e4m3 of {v}",
                        pe.my_pe(),
                        g * 128 + i
                    );
                    let back = e4m3_to_f32(b) * got_s;
                    let bound = v.abs() / 16.0 + got_s * 2f32.powi(-10);
                    assert!((back - v).abs() <= bound, "{back} vs {v} (scale {got_s})");
                }
            }
        }
    }
    Ok(())
}

/// Every row of `d`'s FP8 receive area dequantised (`[L, n*M, H]`).
pub fn dequantised(pe: &Pe, buf: &LowLatencyBuffer, d: &LlDispatch) -> Result<Vec<f32>> {
    let h = buf.config().hidden;
    let (q, sc) = buf.recv_x_fp8(d)?;
    let (q, sc) = (pe.local_vec(&q)?, pe.local_vec(&sc)?);
    Ok(q.iter()
        .enumerate()
        .map(|(i, &b)| e4m3_to_f32(b) * sc[i / h * (h / 128) + (i % h) / 128])
        .collect())
}

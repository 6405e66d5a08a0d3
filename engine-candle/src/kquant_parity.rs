//! The K-quant kernels against ggml's own `vec_dot` (ENG-WFMT-2): weight rows and activations
//! recorded with ggml's results by `ci/ggml_kquant_reference.py` (llama.cpp's CPU backend,
//! through llama-cpp-python); the level this CPU runs must give the same f32 bits (and each
//! kernel's own tests hold its portable loop to its SIMD path bit for bit).

use candle_core::quantized::{ggml_file::qtensor_from_ggml, GgmlDType, QTensor};
use candle_core::Device;

use crate::cpu_quant::{quantized_matmuls, QuantRows};
use crate::q4_k_cpu::Q4KMatrix;
use crate::q5_k_cpu::Q5KMatrix;
use crate::q6_k_cpu::Q6KMatrix;

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/ggml_kquant_dots.json"
);

struct Case {
    kind: String,
    weight: QTensor,
    x: Vec<f32>,
    want: u32,
}

fn cases() -> Vec<Case> {
    let text = std::fs::read_to_string(FIXTURE).expect("the fixture is in the repository");
    let doc: serde_json::Value = serde_json::from_str(&text).expect("the fixture is JSON");
    let cases = doc["cases"].as_array().expect("cases");
    cases
        .iter()
        .map(|c| {
            let kind = c["type"].as_str().expect("type").to_string();
            let hex = c["weight_hex"].as_str().expect("weight_hex");
            let bytes: Vec<u8> = (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
                .collect();
            let k = 256 * c["blocks"].as_u64().expect("blocks") as usize;
            let dtype = match kind.as_str() {
                "q4_k" => GgmlDType::Q4K,
                "q5_k" => GgmlDType::Q5K,
                _ => GgmlDType::Q6K,
            };
            let weight =
                qtensor_from_ggml(dtype, &bytes, vec![1, k], &Device::Cpu).expect("weight");
            let x = c["x"]
                .as_array()
                .expect("x")
                .iter()
                .map(|v| v.as_f64().expect("a number") as f32)
                .collect();
            let want = c["dot_bits"].as_u64().expect("dot_bits") as u32;
            Case {
                kind,
                weight,
                x,
                want,
            }
        })
        .collect()
}

#[test]
fn q4_k_q5_k_and_q6_k_dots_are_ggmls_bit_for_bit() {
    let cases = cases();
    assert_eq!(cases.len(), 12);
    for (i, c) in cases.iter().enumerate() {
        let w: Box<dyn QuantRows> = match c.kind.as_str() {
            "q4_k" => Box::new(Q4KMatrix::from_qtensor(&c.weight).expect("a Q4_K row")),
            "q5_k" => Box::new(Q5KMatrix::from_qtensor(&c.weight).expect("a Q5_K row")),
            _ => Box::new(Q6KMatrix::from_qtensor(&c.weight).expect("a Q6_K row")),
        };
        // the level this CPU runs (the dispatcher's choice) and, through four copies of the
        // row as a batch, the four-row kernel
        let one = quantized_matmuls(&[w.as_ref()], &c.x, 1)[0][0];
        assert_eq!(
            one.to_bits(),
            c.want,
            "case {i} ({}): {one} vs {}",
            c.kind,
            f32::from_bits(c.want)
        );
        let x4: Vec<f32> = (0..4).flat_map(|_| c.x.iter().copied()).collect();
        let four = &quantized_matmuls(&[w.as_ref()], &x4, 4)[0];
        assert!(
            four.iter().all(|v| v.to_bits() == c.want),
            "case {i}: {four:?}"
        );
    }
}

//! Borrowing the f32 elements of a CPU tensor for the engine's own kernels, and the way back.

use candle_core::{DType, Result, Shape, Tensor};

/// Runs `f` on the elements of `t` when it is a contiguous f32 tensor on the CPU; `None`
/// otherwise (the caller takes candle's path).
pub(crate) fn with_f32<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> R) -> Option<R> {
    if t.dtype() != DType::F32 || !t.is_contiguous() {
        return None;
    }
    let (storage, layout) = t.storage_and_layout();
    match &*storage {
        candle_core::Storage::Cpu(c) => {
            let all = c.as_slice::<f32>().ok()?;
            let start = layout.start_offset();
            all.get(start..start + t.elem_count()).map(f)
        }
        _ => None,
    }
}

/// A CPU tensor of `shape` holding `v`.
pub(crate) fn cpu_tensor(v: Vec<f32>, shape: &Shape) -> Result<Tensor> {
    Tensor::from_vec(v, shape, &candle_core::Device::Cpu)
}

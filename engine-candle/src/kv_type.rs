//! How keys and values are stored in the cache: f32 (llama.cpp's numerics reproduced lane for
//! lane) or f16 (half the bytes: twice the context in the same memory; the attention converts
//! the positions it reads back to f32 and runs the same kernels).

use candle_core::DType;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvType {
    #[default]
    F32,
    F16,
}

impl KvType {
    pub(crate) fn dtype(self) -> DType {
        match self {
            Self::F32 => DType::F32,
            Self::F16 => DType::F16,
        }
    }

    /// Bytes of one stored key or value element.
    pub fn elem_bytes(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::F16 => 2,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::F16 => "f16",
        }
    }
}

impl std::str::FromStr for KvType {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "f32" => Ok(Self::F32),
            "f16" => Ok(Self::F16),
            other => Err(format!("unknown kv_cache type {other:?} (f32 | f16)")),
        }
    }
}

//! What a GGUF file says of the model in it: its parameter count and its quantization, as
//! Ollama's `/api/show` reports them.

use std::collections::HashMap;

use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::quantized::GgmlDType;

/// The elements of every tensor in the file.
pub fn parameters(content: &Content) -> u64 {
    content
        .tensor_infos
        .values()
        .map(|t| t.shape.elem_count() as u64)
        .sum()
}

/// Where the GGUF's tensor data ends: its last tensor's end after the data offset.
fn data_end(content: &Content) -> u64 {
    let last = content
        .tensor_infos
        .values()
        .map(|t| {
            let blocks = t.shape.elem_count() / t.ggml_dtype.block_size().max(1);
            t.offset + (blocks * t.ggml_dtype.type_size()) as u64
        })
        .max()
        .unwrap_or(0);
    content.tensor_data_offset + last
}

/// llama.cpp's name for a `general.file_type` (its `llama_ftype`), for the types it still
/// writes.
fn file_type_name(ft: u32) -> Option<&'static str> {
    Some(match ft {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        7 => "Q8_0",
        8 => "Q5_0",
        9 => "Q5_1",
        10 => "Q2_K",
        11 => "Q3_K_S",
        12 => "Q3_K_M",
        13 => "Q3_K_L",
        14 => "Q4_K_S",
        15 => "Q4_K_M",
        16 => "Q5_K_S",
        17 => "Q5_K_M",
        18 => "Q6_K",
        32 => "BF16",
        _ => return None,
    })
}

fn dtype_name(t: GgmlDType) -> &'static str {
    match t {
        GgmlDType::F32 => "F32",
        GgmlDType::F16 => "F16",
        GgmlDType::BF16 => "BF16",
        GgmlDType::Q4_0 => "Q4_0",
        GgmlDType::Q4_1 => "Q4_1",
        GgmlDType::Q5_0 => "Q5_0",
        GgmlDType::Q5_1 => "Q5_1",
        GgmlDType::Q8_0 => "Q8_0",
        GgmlDType::Q8_1 => "Q8_1",
        GgmlDType::Q2K => "Q2_K",
        GgmlDType::Q3K => "Q3_K",
        GgmlDType::Q4K => "Q4_K",
        GgmlDType::Q5K => "Q5_K",
        GgmlDType::Q6K => "Q6_K",
        GgmlDType::Q8K => "Q8_K",
    }
}

/// The file's quantization: its `general.file_type` by llama.cpp's name, else the type most
/// of its parameters are stored in.
pub fn quantization(md: &HashMap<String, Value>, content: &Content) -> String {
    let declared = match md.get("general.file_type") {
        Some(Value::U32(v)) => file_type_name(*v),
        Some(Value::I32(v)) => u32::try_from(*v).ok().and_then(file_type_name),
        _ => None,
    };
    if let Some(name) = declared {
        return name.to_string();
    }
    let mut by_type: HashMap<&'static str, u64> = HashMap::new();
    for t in content.tensor_infos.values() {
        *by_type.entry(dtype_name(t.ggml_dtype)).or_default() += t.shape.elem_count() as u64;
    }
    by_type
        .into_iter()
        .max_by_key(|(name, n)| (*n, *name))
        .map(|(name, _)| name.to_string())
        .unwrap_or_else(|| "F32".to_string())
}

/// What a GGUF file's header says, read without loading its weights (a model folder's
/// listing).
#[derive(Debug, Clone, PartialEq)]
pub struct FileFacts {
    /// `general.architecture` (`llama`, `gemma3`, …).
    pub architecture: String,
    /// As [`quantization`] names it.
    pub quantization: String,
    pub parameters: u64,
    /// `<architecture>.context_length`, the trained context.
    pub context_length: Option<u64>,
    /// `general.name`.
    pub name: Option<String>,
}

/// Reads the header (metadata and tensor table) of the GGUF at `path`.
pub fn inspect(path: &std::path::Path) -> crate::Result<FileFacts> {
    let mut f = std::fs::File::open(path).map_err(|source| crate::EngineError::ModelFile {
        path: path.display().to_string(),
        source,
    })?;
    let content = Content::read(&mut std::io::BufReader::new(&mut f)).map_err(|e| {
        crate::EngineError::BadModel(format!(
            "{}: {}",
            path.display(),
            crate::error::message_of(&e)
        ))
    })?;
    // a file cut short (a download that stopped) reads as a header: its tensors say where it
    // must end — refused before anything is unloaded to make room for it
    let needs = data_end(&content);
    let has = f.metadata().map_or(u64::MAX, |m| m.len());
    if needs > has {
        return Err(crate::EngineError::BadModel(format!(
            "{}: truncated: its tensors end at byte {needs}, the file has {has} bytes",
            path.display()
        )));
    }
    let md = &content.metadata;
    let text = |k: &str| match md.get(k) {
        Some(Value::String(s)) => Some(s.clone()),
        _ => None,
    };
    let architecture = text("general.architecture").ok_or_else(|| {
        crate::EngineError::BadModel(format!("{}: no general.architecture", path.display()))
    })?;
    let context_length = match md.get(&format!("{architecture}.context_length")) {
        Some(Value::U32(v)) => Some(u64::from(*v)),
        Some(Value::U64(v)) => Some(*v),
        Some(Value::I32(v)) => u64::try_from(*v).ok(),
        _ => None,
    };
    Ok(FileFacts {
        quantization: quantization(md, &content),
        parameters: parameters(&content),
        context_length,
        name: text("general.name"),
        architecture,
    })
}

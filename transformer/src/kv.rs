//! The KV row contract with the engine, and a request's KV while it decodes.
//!
//! A row is one token position: `[layer][kv_head][K: head_dim values][V: head_dim values]`,
//! each value in the compute dtype's little-endian encoding (f32 on CPU), K after RoPE.

use candle_core::{DType, Device, Tensor};

use crate::error::{CandleContext, TransformerError};

/// The shape of one KV row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvLayout {
    pub layers: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub dtype_bytes: usize,
}

impl KvLayout {
    /// Bytes of one token position's K and V over all layers and KV heads.
    pub fn row_bytes(&self) -> usize {
        self.layers * self.kv_heads * 2 * self.head_dim * self.dtype_bytes
    }

    /// Bytes of one head's K (or V) in a row.
    fn value_bytes(&self) -> usize {
        self.head_dim * self.dtype_bytes
    }

    /// Byte offset in a row of (layer, head, which: 0 = K, 1 = V).
    fn offset(&self, layer: usize, head: usize, which: usize) -> usize {
        ((layer * self.kv_heads + head) * 2 + which) * self.value_bytes()
    }
}

/// One layer's K and V, each (kv_heads, positions, head_dim).
#[derive(Debug, Clone)]
pub(crate) struct LayerKv {
    pub(crate) k: Tensor,
    pub(crate) v: Tensor,
}

/// A request's KV for every position computed so far, on the compute device.
#[derive(Debug, Clone)]
pub struct RequestKv {
    pub(crate) layout: KvLayout,
    /// Empty while the request has no positions.
    pub(crate) layers: Vec<LayerKv>,
    pub(crate) len: usize,
}

impl RequestKv {
    /// Token positions held.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes these positions take as rows (`len * row_bytes`).
    pub fn bytes(&self) -> usize {
        self.len * self.layout.row_bytes()
    }

    /// The rows of positions [start, end) in the row layout (e.g. a decoded token's row,
    /// for the engine to store in its blocks).
    pub fn rows(&self, start: usize, end: usize) -> Result<Vec<u8>, TransformerError> {
        if start > end || end > self.len {
            return Err(TransformerError::Input(format!(
                "rows [{start}, {end}) requested of a request KV holding {} positions",
                self.len
            )));
        }
        if start == end {
            return Ok(Vec::new());
        }
        let mut parts = Vec::with_capacity(self.layers.len());
        for layer in &self.layers {
            parts.push(LayerKv {
                k: layer
                    .k
                    .narrow(1, start, end - start)
                    .op("kv rows narrow k")?,
                v: layer
                    .v
                    .narrow(1, start, end - start)
                    .op("kv rows narrow v")?,
            });
        }
        layers_to_rows(&self.layout, &parts)
    }
}

/// Split the context chunks into per-layer K/V tensors; the chunks must total `rows` rows.
pub(crate) fn rows_to_layers(
    layout: &KvLayout,
    chunks: &[&[u8]],
    rows: usize,
    dtype: DType,
    device: &Device,
) -> Result<Vec<LayerKv>, TransformerError> {
    let row_bytes = layout.row_bytes();
    let mut total = 0usize;
    for (i, chunk) in chunks.iter().enumerate() {
        if chunk.len() % row_bytes != 0 {
            return Err(TransformerError::Context(format!(
                "chunk {i} holds {} bytes, not a whole number of {row_bytes}-byte rows",
                chunk.len()
            )));
        }
        total += chunk.len() / row_bytes;
    }
    if total != rows {
        return Err(TransformerError::Context(format!(
            "context_len is {rows} positions but the {} chunks hold {total} rows",
            chunks.len()
        )));
    }
    if rows == 0 {
        return Ok(Vec::new());
    }
    let vb = layout.value_bytes();
    let head_stride = rows * vb;
    let mut out = Vec::with_capacity(layout.layers);
    for layer in 0..layout.layers {
        let mut k = vec![0u8; layout.kv_heads * head_stride];
        let mut v = vec![0u8; layout.kv_heads * head_stride];
        let mut position = 0;
        for chunk in chunks {
            for row in chunk.chunks_exact(row_bytes) {
                for head in 0..layout.kv_heads {
                    let dst = head * head_stride + position * vb;
                    let ko = layout.offset(layer, head, 0);
                    let vo = layout.offset(layer, head, 1);
                    k[dst..dst + vb].copy_from_slice(&row[ko..ko + vb]);
                    v[dst..dst + vb].copy_from_slice(&row[vo..vo + vb]);
                }
                position += 1;
            }
        }
        let shape = [layout.kv_heads, rows, layout.head_dim];
        out.push(LayerKv {
            k: Tensor::from_raw_buffer(&k, dtype, &shape, device).op("context k")?,
            v: Tensor::from_raw_buffer(&v, dtype, &shape, device).op("context v")?,
        });
    }
    Ok(out)
}

/// The little-endian bytes of a tensor's values in its own dtype.
fn tensor_bytes(t: &Tensor) -> Result<Vec<u8>, TransformerError> {
    let flat = t
        .flatten_all()
        .and_then(|t| t.to_device(&Device::Cpu))
        .op("kv to host")?;
    Ok(match flat.dtype() {
        DType::F32 => flat
            .to_vec1::<f32>()
            .op("kv f32 values")?
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect(),
        DType::BF16 => flat
            .to_vec1::<half::bf16>()
            .op("kv bf16 values")?
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect(),
        DType::F16 => flat
            .to_vec1::<half::f16>()
            .op("kv f16 values")?
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect(),
        other => {
            return Err(TransformerError::Input(format!(
                "KV in dtype {other:?} has no row encoding"
            )))
        }
    })
}

/// Interleave per-layer K/V (each (kv_heads, n, head_dim)) into n rows.
pub(crate) fn layers_to_rows(
    layout: &KvLayout,
    layers: &[LayerKv],
) -> Result<Vec<u8>, TransformerError> {
    let Some(first) = layers.first() else {
        return Ok(Vec::new());
    };
    let n = first.k.dim(1).op("kv rows count")?;
    let row_bytes = layout.row_bytes();
    let vb = layout.value_bytes();
    let head_stride = n * vb;
    let mut out = vec![0u8; n * row_bytes];
    for (layer, kv) in layers.iter().enumerate() {
        let k = tensor_bytes(&kv.k)?;
        let v = tensor_bytes(&kv.v)?;
        if k.len() != layout.kv_heads * head_stride || v.len() != k.len() {
            return Err(TransformerError::Input(format!(
                "layer {layer} KV holds {} bytes, the layout implies {}",
                k.len(),
                layout.kv_heads * head_stride
            )));
        }
        for (position, row) in out.chunks_exact_mut(row_bytes).enumerate() {
            for head in 0..layout.kv_heads {
                let src = head * head_stride + position * vb;
                let ko = layout.offset(layer, head, 0);
                let vo = layout.offset(layer, head, 1);
                row[ko..ko + vb].copy_from_slice(&k[src..src + vb]);
                row[vo..vo + vb].copy_from_slice(&v[src..src + vb]);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_round_trip_through_layers() {
        let layout = KvLayout {
            layers: 2,
            kv_heads: 3,
            head_dim: 4,
            dtype_bytes: 4,
        };
        let rows = 5;
        let bytes: Vec<u8> = (0..rows * layout.row_bytes() / 4)
            .flat_map(|i| (i as f32).to_le_bytes())
            .collect();
        let split = 2 * layout.row_bytes();
        let chunks = [&bytes[..split], &bytes[split..]];
        let layers = rows_to_layers(&layout, &chunks, rows, DType::F32, &Device::Cpu).unwrap();
        // Row 1, layer 1, head 2, V starts at value index row_values + offset/4.
        let v = layers[1].v.to_vec3::<f32>().unwrap();
        let row_values = layout.row_bytes() / 4;
        let expect = (row_values + layout.offset(1, 2, 1) / 4) as f32;
        assert_eq!(v[2][1][0], expect);
        assert_eq!(layers_to_rows(&layout, &layers).unwrap(), bytes);
    }

    #[test]
    fn wrong_counts_are_errors() {
        let layout = KvLayout {
            layers: 1,
            kv_heads: 1,
            head_dim: 2,
            dtype_bytes: 4,
        };
        let row = vec![0u8; layout.row_bytes()];
        let half = &row[..4];
        let err = rows_to_layers(&layout, &[half], 0, DType::F32, &Device::Cpu).unwrap_err();
        assert!(err.to_string().contains("chunk 0 holds 4 bytes"), "{err}");
        let err = rows_to_layers(&layout, &[&row, &row], 3, DType::F32, &Device::Cpu).unwrap_err();
        assert!(err.to_string().contains("context_len is 3"), "{err}");
        assert!(err.to_string().contains("hold 2 rows"), "{err}");
    }
}

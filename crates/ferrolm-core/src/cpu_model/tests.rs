//! The forward's own consistency: a prompt in one step gives the logits that the same
//! prompt fed token by token gives (the KV pool carries the context), batching requests
//! together changes nothing, and bad batches and shapes are refused by name. Agreement
//! with the float forward of the same weights is the Python suite's (tests/test_model_quant.py).

use super::*;
use crate::quant::QuantType;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        ((self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40) as f32 / (1u64 << 24) as f32) - 0.5
    }
    fn floats(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.next() * scale).collect()
    }
}

const HIDDEN: usize = 64;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const HEAD_DIM: usize = 16;
const FFN: usize = 96;
const VOCAB: usize = 50;

fn shape() -> Shape {
    Shape {
        hidden: HIDDEN,
        num_heads: HEADS,
        num_kv_heads: KV_HEADS,
        head_dim: HEAD_DIM,
        intermediate: FFN,
        vocab: VOCAB,
        rms_eps: 1e-5,
        sliding_window: None,
        inv_freq: (0..HEAD_DIM / 2).map(|i| 10000f64.powf(-(2.0 * i as f64) / HEAD_DIM as f64)).collect(),
        rope_scale: 1.0,
    }
}

/// A matrix of random weights in `ty` (made by quantizing f32 weights as Q8_0 where asked).
fn linear(rng: &mut Rng, name: &str, ty: QuantType, rows: usize, cols: usize) -> Linear {
    let w = rng.floats(rows * cols, 0.4);
    let data = match ty {
        QuantType::F32 => w.iter().flat_map(|v| v.to_le_bytes()).collect(),
        QuantType::Q8_0 => crate::quant::dot::quantize_q8_0(&w)
            .iter()
            .flat_map(|b| b.d.iter().copied().chain(b.qs.iter().map(|&q| q as u8)))
            .collect(),
        _ => unreachable!(),
    };
    Linear::new(name, ty, rows, cols, data, None).unwrap()
}

fn model(ty: QuantType, layers: usize, slots: usize) -> QuantModel {
    let mut rng = Rng(0x1234_5678_9ABC_DEF1);
    let norm = |rng: &mut Rng, n| rng.floats(n, 0.2).iter().map(|v| 1.0 + v).collect::<Vec<f32>>();
    let layers = (0..layers)
        .map(|_| Layer {
            attn_norm: norm(&mut rng, HIDDEN),
            q: linear(&mut rng, "q", ty, HEADS * HEAD_DIM, HIDDEN),
            k: linear(&mut rng, "k", ty, KV_HEADS * HEAD_DIM, HIDDEN),
            v: linear(&mut rng, "v", ty, KV_HEADS * HEAD_DIM, HIDDEN),
            q_norm: None,
            k_norm: None,
            o: linear(&mut rng, "o", ty, HIDDEN, HEADS * HEAD_DIM),
            ffn_norm: norm(&mut rng, HIDDEN),
            gate: linear(&mut rng, "gate", ty, FFN, HIDDEN),
            up: linear(&mut rng, "up", ty, FFN, HIDDEN),
            down: linear(&mut rng, "down", ty, HIDDEN, FFN),
        })
        .collect();
    let embed = linear(&mut rng, "embed", ty, VOCAB, HIDDEN);
    let final_norm = norm(&mut rng, HIDDEN);
    QuantModel::new(shape(), Weights { embed, head: None, final_norm, layers }, slots, KvDtype::F32, 2)
        .unwrap()
}

/// One request's prefill of `ids` into slots `first..first + len` (nothing cached).
fn prefill(m: &mut QuantModel, ids: &[u32], first: u32, all: bool) -> Vec<f32> {
    let n = ids.len() as u32;
    let positions: Vec<u32> = (0..n).collect();
    let slots: Vec<u32> = (first..first + n).collect();
    let batch = Batch {
        input_ids: ids,
        positions: &positions,
        out_slots: &slots,
        qo_offsets: &[0, n],
        kv_slots: &slots,
        kv_offsets: &[0, n],
        loras: &[],
    };
    m.forward(&batch, all).unwrap()
}

fn close(a: &[f32], b: &[f32], tol: f32) {
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!((x - y).abs() <= tol * (1.0 + y.abs()), "logit {i}: {x} vs {y}");
    }
}

#[test]
fn a_prompt_in_one_step_matches_it_token_by_token() {
    for ty in [QuantType::F32, QuantType::Q8_0] {
        let ids = [3u32, 17, 42, 5, 9, 33];
        let mut whole = model(ty, 2, 32);
        let all = prefill(&mut whole, &ids, 0, true);
        let mut stepped = model(ty, 2, 32);
        for t in 0..ids.len() {
            let positions = [t as u32];
            let slots: Vec<u32> = (0..=t as u32).collect();
            let batch = Batch {
                input_ids: &ids[t..t + 1],
                positions: &positions,
                out_slots: &slots[t..],
                qo_offsets: &[0, 1],
                kv_slots: &slots,
                kv_offsets: &[0, t as u32 + 1],
                loras: &[],
            };
            let logits = stepped.forward(&batch, false).unwrap();
            // per-token products read the same quantized activations either way: close to
            // f32 rounding (the attention's summation order differs between the two)
            close(&logits, &all[t * VOCAB..(t + 1) * VOCAB], 1e-4);
        }
        let last = prefill(&mut model(ty, 2, 32), &ids, 0, false);
        assert_eq!(last, all[(ids.len() - 1) * VOCAB..].to_vec(), "{ty}: last row");
    }
}

#[test]
fn requests_batched_together_match_each_alone() {
    let (a, b) = ([1u32, 2, 3, 4], [7u32, 8, 9]);
    let alone_a = prefill(&mut model(QuantType::Q8_0, 2, 32), &a, 0, false);
    let alone_b = prefill(&mut model(QuantType::Q8_0, 2, 32), &b, 10, false);
    let mut m = model(QuantType::Q8_0, 2, 32);
    let ids: Vec<u32> = a.iter().chain(&b).copied().collect();
    let positions = [0, 1, 2, 3, 0, 1, 2];
    let slots = [0, 1, 2, 3, 10, 11, 12];
    let batch = Batch {
        input_ids: &ids,
        positions: &positions,
        out_slots: &slots,
        qo_offsets: &[0, 4, 7],
        kv_slots: &slots,
        kv_offsets: &[0, 4, 7],
        loras: &[],
    };
    let both = m.forward(&batch, false).unwrap();
    assert_eq!(&both[..VOCAB], &alone_a[..]);
    assert_eq!(&both[VOCAB..], &alone_b[..]);
}

#[test]
fn bad_batches_are_refused_by_field() {
    let mut m = model(QuantType::F32, 1, 8);
    let batch = |ids: &'static [u32], slots: &'static [u32]| Batch {
        input_ids: ids,
        positions: &[0],
        out_slots: slots,
        qo_offsets: &[0, 1],
        kv_slots: slots,
        kv_offsets: &[0, 1],
        loras: &[],
    };
    let err = m.forward(&batch(&[VOCAB as u32], &[0]), false).unwrap_err();
    assert_eq!(err.field, "input_ids");
    let err = m.forward(&batch(&[1], &[8]), false).unwrap_err();
    assert_eq!(err.field, "kv_slots");
}

#[test]
fn shapes_that_do_not_fit_name_the_tensor() {
    let mut rng = Rng(7);
    let err = Linear::new("blk.0.attn_q", QuantType::Q8_0, 4, 40, vec![0; 4 * 34], None).err().unwrap();
    assert_eq!(err.field, "blk.0.attn_q");
    let mut wrong = model(QuantType::F32, 1, 4);
    let layer = wrong.layers.pop().unwrap();
    let bad = Layer { down: linear(&mut rng, "down", QuantType::F32, HIDDEN, HIDDEN), ..layer };
    let embed = linear(&mut rng, "embed", QuantType::F32, VOCAB, HIDDEN);
    let err = QuantModel::new(
        shape(),
        Weights { embed, head: None, final_norm: vec![1.0; HIDDEN], layers: vec![bad] },
        4,
        KvDtype::F32,
        1,
    )
    .err()
    .unwrap();
    assert_eq!(err.field, "blk.0.ffn_down");
}

/// A prefill-sized step multiplies in f32 over the dequantized weights; one token at a
/// time multiplies quantized activations: the two agree within the activations' rounding.
#[test]
fn a_long_prompt_in_f32_matches_it_token_by_token() {
    let ids: Vec<u32> =
        (0..linear::FLOAT_FROM_TOKENS as u32 + 5).map(|i| (i * 7 + 3) % VOCAB as u32).collect();
    let all = prefill(&mut model(QuantType::Q8_0, 2, 64), &ids, 0, true);
    let mut stepped = model(QuantType::Q8_0, 2, 64);
    let slots: Vec<u32> = (0..ids.len() as u32).collect();
    let mut worst = 0f32;
    for t in 0..ids.len() {
        let batch = Batch {
            input_ids: &ids[t..t + 1],
            positions: &[t as u32],
            out_slots: &slots[t..t + 1],
            qo_offsets: &[0, 1],
            kv_slots: &slots[..=t],
            kv_offsets: &[0, t as u32 + 1],
            loras: &[],
        };
        let logits = stepped.forward(&batch, false).unwrap();
        for (a, b) in logits.iter().zip(&all[t * VOCAB..(t + 1) * VOCAB]) {
            worst = worst.max((a - b).abs());
        }
    }
    let spread = all.iter().fold(f32::MIN, |m, &v| m.max(v)) - all.iter().fold(f32::MAX, |m, &v| m.min(v));
    assert!(worst > 0.0, "the two paths are expected to round differently");
    assert!(worst <= 0.02 * spread, "max difference {worst} of a logit range {spread}");
}

/// Float rows (F32, F16, BF16) times one and a few tokens: each the f32 dot of the widened
/// row with the token alone (the portable lanes' result bit for bit, whichever build the
/// CPU runs), within f32 rounding of the exact product.
#[test]
fn float_rows_are_their_widened_f32_products() {
    let (rows, cols, tokens) = (37, 200, 3); // 200: a tail after the 16-lane body
    let mut rng = Rng(0x0F1E_2D3C_4B5A_6978);
    let w = rng.floats(rows * cols, 0.4);
    let x = rng.floats(tokens * cols, 1.0);
    for ty in [QuantType::F32, QuantType::F16, QuantType::BF16] {
        let data: Vec<u8> = match ty {
            QuantType::F32 => w.iter().flat_map(|v| v.to_le_bytes()).collect(),
            QuantType::F16 => w.iter().flat_map(|&v| f16::from_f32(v).to_le_bytes()).collect(),
            _ => w.iter().flat_map(|&v| bf16::from_f32(v).to_le_bytes()).collect(),
        };
        let mut widened = vec![0f32; rows * cols];
        crate::quant::dequantize(ty, &data, &mut widened).unwrap();
        let m = Linear::new("w", ty, rows, cols, data, None).unwrap();
        for n in [1, tokens] {
            let mut out = vec![0f32; n * rows];
            m.forward(&mut Inputs::new(&x[..n * cols], cols), &mut out);
            for t in 0..n {
                let xt = &x[t * cols..(t + 1) * cols];
                for r in 0..rows {
                    let wr = &widened[r * cols..(r + 1) * cols];
                    let got = out[t * rows + r];
                    assert_eq!(got.to_bits(), linear::dot_lanes(wr, xt).to_bits(), "{ty} row {r} token {t}");
                    let exact: f64 = wr.iter().zip(xt).map(|(&a, &b)| a as f64 * b as f64).sum();
                    let scale: f64 = wr.iter().zip(xt).map(|(&a, &b)| (a as f64 * b as f64).abs()).sum();
                    assert!((got as f64 - exact).abs() <= 1e-6 * scale, "{ty}: {got} against {exact}");
                }
            }
        }
    }
}

//! The growing KV cache (src/kv.rs): a cache holds what its sequence has filled, keeps its
//! keys and values through every growth (attention equal to the CPU's over positions
//! written before and after), gives its memory back when released, and a reservation past
//! the backend's limit fails with `KvMemory` until another cache gives memory back; so do
//! positions past what the adapter binds in one buffer (a buffer holds as many layers as fit).

mod common;

use kiln_backend::cpu::CpuBackend;
use kiln_backend::{AttnShape, BackendError, KvType, LlmOps, TensorOps};
use kiln_wgpu::{GpuOptions, WgpuBackend};

const LAYERS: usize = 2;
const KV_HEADS: usize = 2;
const HEADS: usize = 4;
const HD: usize = 64;

/// Bytes of K and V for `slots` slots of every layer and head, f16.
fn f16_bytes(slots: usize) -> usize {
    2 * LAYERS * KV_HEADS * slots * HD * 2
}

#[test]
fn a_cache_grows_with_its_sequence_and_keeps_what_it_holds() {
    let Some(b) = common::gpu() else { return };
    grows_and_keeps(&b);
    // A binding limit of 3 MiB: a buffer a layer (2 MiB each at 4096 positions).
    let opts = GpuOptions {
        max_binding: Some(3 << 20),
        ..Default::default()
    };
    grows_and_keeps(&WgpuBackend::with_options(&opts).unwrap());
}

#[test]
fn positions_past_what_the_adapter_binds_fail_with_the_cache_error() {
    if common::gpu().is_none() {
        return;
    }
    // 1 MiB a buffer: a layer's f32 rows bind 2048 positions of the 4096.
    let opts = GpuOptions {
        max_binding: Some(1 << 20),
        ..Default::default()
    };
    let b = WgpuBackend::with_options(&opts).unwrap();
    let mut c = b
        .kv_cache_typed(LAYERS, 4096, KV_HEADS, HD, KvType::F32)
        .unwrap();
    b.kv_reserve(&mut c, 0, 2048).unwrap();
    match b.kv_reserve(&mut c, 2048, 1) {
        Err(BackendError::KvMemory { what }) => assert!(what.contains("binds"), "{what}"),
        other => panic!("positions past the binding limit: {other:?}"),
    }
    assert_eq!(b.kv_cache_bytes(&c), 2 * f16_bytes(2048));
}

fn grows_and_keeps(b: &WgpuBackend) {
    let cpu = CpuBackend::new(1);
    let n_ctx = 4096;
    let mut c = b
        .kv_cache_typed(LAYERS, n_ctx, KV_HEADS, HD, KvType::F32)
        .unwrap();
    let mut cr = cpu
        .kv_cache_typed(LAYERS, n_ctx, KV_HEADS, HD, KvType::F32)
        .unwrap();
    // A word a buffer.
    assert!(b.kv_cache_bytes(&c) <= 16, "a new cache holds no slots");
    let mut rng = common::Rng(0x4b56);
    let kd = KV_HEADS * HD;
    let mut pos = 0;
    // 10, then single tokens past 64 slots, then 100 at once past 128: three growths,
    // the second and third keeping positions written before.
    let steps: Vec<usize> = [10].into_iter().chain([1; 60]).chain([100]).collect();
    let mut slots_seen = Vec::new();
    for n in steps {
        if pos % 2 == 0 {
            b.kv_reserve(&mut c, pos, n).unwrap();
        }
        for layer in 0..LAYERS {
            let (k, v) = (rng.v(n * kd), rng.v(n * kd));
            let (kt, vt) = (b.tensor_from(n, kd, &k), b.tensor_from(n, kd, &v));
            let (kr, vr) = (cpu.tensor_from(n, kd, &k), cpu.tensor_from(n, kd, &v));
            // Odd steps are not reserved: the store grows the cache itself.
            b.kv_store(&mut c, layer, &kt, &vt, pos, n);
            cpu.kv_store(&mut cr, layer, &kr, &vr, pos, n);
        }
        pos += n;
        let bytes = b.kv_cache_bytes(&c);
        if slots_seen.last() != Some(&bytes) {
            slots_seen.push(bytes);
        }
    }
    assert_eq!(pos, 170);
    // 10 -> 64 slots, 65 -> 128, 170 -> 256 (at least double, whole steps of 64).
    let want: Vec<usize> = [64, 128, 256]
        .into_iter()
        .map(|s| 2 * f16_bytes(s))
        .collect();
    assert_eq!(slots_seen, want, "f32 bytes held after each growth");
    assert!(b.kv_cache_bytes(&c) < 2 * f16_bytes(n_ctx) / 8);

    // Every position, through the decode path (1 token) and the prompt path (40).
    for n_tokens in [1, 40] {
        let shape = AttnShape {
            n_heads: HEADS,
            n_kv_heads: KV_HEADS,
            head_dim: HD,
            pos0: pos - n_tokens,
            n_tokens,
            window: 0,
        };
        let q = rng.v(n_tokens * HEADS * HD);
        let qt = b.tensor_from(n_tokens, HEADS * HD, &q);
        let qr = cpu.tensor_from(n_tokens, HEADS * HD, &q);
        for layer in 0..LAYERS {
            let mut out = b.tensor(n_tokens, HEADS * HD);
            let mut outr = cpu.tensor(n_tokens, HEADS * HD);
            b.attention(&qt, &c, layer, shape, &mut out);
            cpu.attention(&qr, &cr, layer, shape, &mut outr);
            let mut got = vec![0f32; n_tokens * HEADS * HD];
            let mut want = got.clone();
            b.read(&out, n_tokens, &mut got);
            cpu.read(&outr, n_tokens, &mut want);
            let e = common::rel(&got, &want);
            assert!(e < 1e-4, "{n_tokens} tokens, layer {layer}: rel {e}");
        }
    }

    // Released: the memory goes back; written again from position 0, it grows again.
    let held = b.kv_bytes_held();
    b.kv_release(&mut c);
    assert!(b.kv_cache_bytes(&c) <= 16);
    assert_eq!(
        b.kv_bytes_held(),
        held - 2 * f16_bytes(256) + b.kv_cache_bytes(&c)
    );
    b.kv_reserve(&mut c, 0, 5).unwrap();
    assert_eq!(b.kv_cache_bytes(&c), 2 * f16_bytes(64));
    drop(c);
    assert_eq!(
        b.kv_bytes_held(),
        0,
        "a dropped cache's bytes leave the count"
    );
}

#[test]
fn a_reservation_past_the_limit_fails_until_memory_is_given_back() {
    let Some(b) = common::gpu() else { return };
    let block = f16_bytes(64);
    b.set_kv_byte_limit(Some(2 * block + block / 2));
    let mut c: Vec<_> = (0..3)
        .map(|_| b.kv_cache(LAYERS, 1024, KV_HEADS, HD))
        .collect();
    b.kv_reserve(&mut c[0], 0, 64).unwrap();
    b.kv_reserve(&mut c[1], 0, 30).unwrap();
    match b.kv_reserve(&mut c[2], 0, 1) {
        Err(BackendError::KvMemory { what }) => {
            assert!(what.contains("past the limit"), "{what}")
        }
        other => panic!("a third cache past the limit: {other:?}"),
    }
    // Growing past it fails the same way, and leaves the cache as it was.
    assert!(matches!(
        b.kv_reserve(&mut c[1], 30, 40),
        Err(BackendError::KvMemory { .. })
    ));
    assert_eq!(b.kv_cache_bytes(&c[1]), block);
    b.kv_release(&mut c[0]);
    b.kv_reserve(&mut c[2], 0, 1).unwrap();
    assert_eq!(b.kv_cache_bytes(&c[2]), block);
}

"""The OpenCL C source of :class:`~sakura.runtime.reconstruct.opencl.OpenCLReconstructor`: dequantisation of
v1 factor planes and of v2 plane groups, and the tiled ``A·B + μ`` kernel."""

from sakura.formats.bitplanes import HEAD_BYTES

KERNELS = r"""
#define HEAD %d
// One work-item per packed byte: 8 consecutive values i = 8*byte .. 8*byte+7 of rank component j
// of unit u (i = token for A, channel for B). raw: plane 0 as (R, U, HEAD + pb) [f32 scale, u8
// dead-zone bits, packed bits], then planes 1..bits-1 as (R, U, pb); MSB first (numpy packbits).
__kernel void dequant(__global const uchar *raw, const int bits, const int R, const int U, const int L,
                      const int pb, __global float *out, const int su, const int si, const int sj)
{
    const int byte = get_global_id(0);
    const int j = get_global_id(1);
    const int u = get_global_id(2);
    if (byte >= pb) return;
    const size_t rec = (size_t)j * U + u;
    __global const uchar *p0 = raw + rec * (size_t)(HEAD + pb);
    const uint sbits = (uint)p0[0] | ((uint)p0[1] << 8) | ((uint)p0[2] << 16) | ((uint)p0[3] << 24);
    const float scale = as_float(sbits);
    const uint dead = (p0[4] >> (bits - 1)) & 1u;
    __global const uchar *rest = raw + (size_t)R * U * (HEAD + pb) + rec * (size_t)pb + byte;
    const size_t plane_stride = (size_t)R * U * pb;
    // spread the planes' bits into 8 codes (one byte lane per value)
    uint lo = 0, hi = 0;  // codes of values 0..3 (lo) and 4..7 (hi), 8 bits each
    for (int p = 0; p < bits; ++p) {
        const uint b = p == 0 ? p0[HEAD + byte] : rest[(size_t)(p - 1) * plane_stride];
        lo = (lo << 1) | (((b >> 7) & 1u) | ((b >> 6) & 1u) << 8 | ((b >> 5) & 1u) << 16 | ((b >> 4) & 1u) << 24);
        hi = (hi << 1) | (((b >> 3) & 1u) | ((b >> 2) & 1u) << 8 | ((b >> 1) & 1u) << 16 | (b & 1u) << 24);
    }
    const float step = (float)(1u << (8 - bits)) * (1.0f / 128.0f);  // 2^(1-bits), exact
    const uint mid = 1u << (bits - 1);                                // dead zone: the two cells at 0
    const int i0 = byte * 8;
    __global float *o = out + (size_t)u * su + (size_t)j * sj;
    for (int k = 0; k < 8 && i0 + k < L; ++k) {
        const uint code = ((k < 4 ? lo : hi) >> (8 * (k & 3))) & 0xffu;
        float centre = ((float)code + 0.5f) * step - 1.0f;            // exact: few significant bits
        if (dead && (code == mid || code == mid - 1u))
            centre = 0.0f;
        o[(size_t)(i0 + k) * si] = centre * scale;
    }
}

// Version-2 packs: each component j at its own plane count nbits[j]. raw: plane 0 of every component as
// (R, U, HEAD + pb) records, then the other planes anywhere: plane p >= 1 of component j is the (U, pb)
// block at raw + off[j * 8 + p], stored XOR NOT(plane 0) (magnitude form, docs/pack-format.md §8).
// out: (U, R, L) rows of L contiguous values (strides su, sj). One work-item per packed byte; its 8 values
// are computed as one uint8 / float8 and stored with one vstore8 (contiguous, 2x faster here than 8 scalar
// stores, which a CPU device vectorises across work-items into strided scatters).
__kernel void dequant_groups(__global const uchar *raw, __global const int *off, __global const int *nbits,
                             const int U, const int L, const int pb, __global float *out,
                             const int su, const int sj)
{
    const int byte = get_global_id(0);
    const int j = get_global_id(1);
    const int u = get_global_id(2);
    if (byte >= pb) return;
    const int bits = nbits[j];
    __global const uchar *p0 = raw + ((size_t)j * U + u) * (size_t)(HEAD + pb);
    const uint sbits = (uint)p0[0] | ((uint)p0[1] << 8) | ((uint)p0[2] << 16) | ((uint)p0[3] << 24);
    const float scale = as_float(sbits);
    const uint dead = (p0[4] >> (bits - 1)) & 1u;
    const uint sign = p0[HEAD + byte];
    uint8 code = (uint8)(sign >> 7, sign >> 6, sign >> 5, sign >> 4, sign >> 3, sign >> 2, sign >> 1, sign) & 1u;
    for (int p = 1; p < bits; ++p) {
        const uint b = raw[(size_t)off[j * 8 + p] + (size_t)u * pb + byte] ^ (~sign & 0xffu);
        code = (code << 1) | ((uint8)(b >> 7, b >> 6, b >> 5, b >> 4, b >> 3, b >> 2, b >> 1, b) & 1u);
    }
    const float step = (float)(1u << (8 - bits)) * (1.0f / 128.0f);  // 2^(1-bits), exact
    const uint mid = 1u << (bits - 1);                                // dead zone: the two cells at 0
    float8 centre = (convert_float8(code) + 0.5f) * step - 1.0f;      // exact: few significant bits
    if (dead)
        centre = select(centre, (float8)0.0f, (code == mid) | (code == mid - 1u));
    const float8 v = centre * scale;
    __global float *o = out + (size_t)u * su + (size_t)j * sj;
    const int i0 = byte * 8;
    if (i0 + 8 <= L) {
        vstore8(v, 0, o + i0);
    } else {  // the row's last, partial byte
        float tail[8];
        vstore8(v, 0, tail);
        for (int k = 0; k < L - i0; ++k)
            o[i0 + k] = tail[k];
    }
}

// out[u, i, c] = mean[u, c] + sum_j A[u, i, j] * B[u, j, c]; A (U, n, r), B (U, r, d). 16x16 tiles.
#define TILE 16
__kernel void lowrank(__global const float *A, __global const float *B, __global const float *mean,
                      __global float *out, const int n, const int r, const int d)
{
    const int c = get_global_id(0), i = get_global_id(1), u = get_global_id(2);
    const int lc = get_local_id(0), li = get_local_id(1);
    __local float As[TILE][TILE];
    __local float Bs[TILE][TILE];
    __global const float *Au = A + (size_t)u * n * r;
    __global const float *Bu = B + (size_t)u * r * d;
    float acc = 0.0f;
    for (int t = 0; t < r; t += TILE) {
        As[li][lc] = (i < n && t + lc < r) ? Au[(size_t)i * r + t + lc] : 0.0f;
        Bs[li][lc] = (t + li < r && c < d) ? Bu[(size_t)(t + li) * d + c] : 0.0f;
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int k = 0; k < TILE; ++k)
            acc += As[li][k] * Bs[k][lc];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (i < n && c < d)
        out[(size_t)u * n * d + (size_t)i * d + c] = mean[(size_t)u * d + c] + acc;
}
""" % HEAD_BYTES

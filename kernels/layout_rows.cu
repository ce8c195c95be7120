// A Gather by a table of constant indices (ops/layout/spec.py's GatherSpec.table), as a copy of whole
// blocks: the data seen as [outer, AXIS, INNER] and the output as [outer, COUNT, INNER], then
// out[o][i][:] = in[o][table[i]][:]. Swin's window partition, reverse and cyclic shift, written as one
// row gather at load (graph/passes/row_gather.py), are such copies with INNER the channels.
// A thread copies VEC floats (4, as float4, where INNER is a multiple of 4 and both arrays start on 16
// bytes; else 1); the outer extent (the batch) is what `vectors` leaves. Both arrays C-contiguous.
#ifndef VEC
#define VEC 1
#endif
#if VEC == 4
typedef float4 vector_t;
#else
typedef float vector_t;
#endif

constexpr long long row_vectors = INNER / VEC;

extern "C" __global__ void __launch_bounds__(256)
layout_rows(const float* __restrict__ in, const int* __restrict__ table, float* __restrict__ out, long long vectors)
{
    const long long v = blockIdx.x * 256LL + threadIdx.x;
    if (v >= vectors) return;
    const long long row = v / row_vectors;
    const long long outer = row / COUNT;
    const long long source_row = outer * AXIS + __ldg(table + row % COUNT);
    reinterpret_cast<vector_t*>(out)[v] = __ldg(reinterpret_cast<const vector_t*>(in) + source_row * row_vectors + v % row_vectors);
}

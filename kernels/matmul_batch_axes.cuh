// Where output matrix j of a batched MatMul finds its operands' matrices: the leading axes broadcast
// as numpy does (gemm_batched.cu's and gemm_batched_tc.cu's macros BATCH_RANK, OUT_DIM<i>, A_STRIDE<i>,
// B_STRIDE<i>: see there).
#ifndef OPPLUGIN_MATMUL_BATCH_AXES_CUH
#define OPPLUGIN_MATMUL_BATCH_AXES_CUH

__device__ __forceinline__ void matrix_offsets(long long j, long long& a_offset, long long& b_offset)
{
    a_offset = 0;
    b_offset = 0;
#if BATCH_RANK > 3
    a_offset += (j % OUT_DIM3) * (long long)A_STRIDE3;
    b_offset += (j % OUT_DIM3) * (long long)B_STRIDE3;
    j /= OUT_DIM3;
#endif
#if BATCH_RANK > 2
    a_offset += (j % OUT_DIM2) * (long long)A_STRIDE2;
    b_offset += (j % OUT_DIM2) * (long long)B_STRIDE2;
    j /= OUT_DIM2;
#endif
#if BATCH_RANK > 1
    a_offset += (j % OUT_DIM1) * (long long)A_STRIDE1;
    b_offset += (j % OUT_DIM1) * (long long)B_STRIDE1;
    j /= OUT_DIM1;
#endif
    a_offset += j * (long long)A_STRIDE0;
    b_offset += j * (long long)B_STRIDE0;
}

// a, b and c moved to output matrix j = first + blockIdx.z and its operands' matrices
__device__ __forceinline__ void locate_matrix(int first, const float* __restrict__& a, const float* __restrict__& b,
                                              float* __restrict__& c)
{
    const long long j = (long long)first + blockIdx.z;
    long long a_offset, b_offset;
    matrix_offsets(j, a_offset, b_offset);
    a += a_offset;
    b += b_offset;
    c += j * ((long long)M * N);
}

#endif

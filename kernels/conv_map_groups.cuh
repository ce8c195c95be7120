// Shared by the map-group kernels (conv_const_mo, conv_const_rb, conv_const_tile).
// Include after the kernel's conv_tile<FIRST, COUNT>; needs M, MO and GROUPS.
//
// for_map_group<0>(blockIdx.y, args...) runs conv_tile for the block's group of
// MO output maps. `if constexpr` unfolds the chain at compile time, one copy of
// conv_tile per group, so each copy sees its first map as a literal and its
// weights as fixed offsets into the constant bank.
template <int GI, typename... Args>
__device__ __forceinline__ void for_map_group(int group, Args... args)
{
    constexpr int first = GI * MO;
    constexpr int count = (M - first < MO) ? (M - first) : MO;
    if (group == GI) {
        conv_tile<first, count>(args...);
    } else if constexpr (GI + 1 < GROUPS) {
        for_map_group<GI + 1>(group, args...);
    }
}

// grid_dependency: programmatic dependent launch (Hopper on). Inside a CUDA graph, a kernel's launch, the placing of its
// blocks and its first instructions follow the end of the kernel before it: about 1.5 us a kernel in a graph of 100
// small ones on an H200, 0.76 us launched programmatically. Launched that way (gpu/dependent_launch.py), a kernel is
// placed while the one before it on the stream still runs, and must itself wait for that kernel's grid to finish, and
// for the memory it wrote, before it reads or writes memory.
//
// A kernel opts in with AWAITS_PREVIOUS_GRID(its name) at file scope, which the runtime looks up in the loaded module,
// and await_previous_grid() as its first statement. Both take effect only where the runtime compiles with
// AWAIT_PREVIOUS_GRIDS (its default; OPPLUGIN_DEPENDENT_LAUNCH=0 leaves it out) for sm_90 or later: elsewhere the call
// is empty and no symbol is declared, so the kernel is the same code as without them and is launched plainly (sm_80
// code is the same either way, what tests/ops/test_kernel_compile.py's quick checks of sm_80 alone rely on).
#ifndef OPPLUGIN_GRID_DEPENDENCY_CUH
#define OPPLUGIN_GRID_DEPENDENCY_CUH

#if __CUDA_ARCH__ >= 900 && defined(AWAIT_PREVIOUS_GRIDS)
#define AWAITS_PREVIOUS_GRID(kernel) extern "C" __device__ const int kernel##_awaits_previous_grid = 1;
#else
#define AWAITS_PREVIOUS_GRID(kernel)
#endif

__device__ __forceinline__ void await_previous_grid()
{
#if __CUDA_ARCH__ >= 900 && defined(AWAIT_PREVIOUS_GRIDS)
    asm volatile("griddepcontrol.wait;\n" ::: "memory");  // the kernel before has finished, its writes visible
    // the next kernel may be placed once every block of this one has begun (so none of them waits for an SM)
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

#endif

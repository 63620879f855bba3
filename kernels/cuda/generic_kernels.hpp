// generic_kernels — which form of a kernel the launchers pick (host side, no device code:
// tests and the backend include it directly). See launch.cuh.
#pragma once

namespace cedar::kernels::cuda {

// Generic kernels, for A/B and the tests. Each step launches every hot kernel once per
// multiprocessor, and the step's code does not fit the instruction caches, so a kernel's code is
// fetched from L2 again on most launches: a launch that runs few of its kernel's instructions,
// spread over a large body (every weight format inline, every tail), waits on instruction fetch.
// So the launchers of the two ops where that was measured pick a form compiled for the launch's
// case — the mHC site (hc_fn format and last-block tail) and the gathers (table format) —
// computing exactly what the generic form computes, unless the op's bit is set in the calling
// thread's mask, which sends it to the one generic kernel instead (the same bits, the old code
// size). Measured (H100, session 44, rand1b at batch 1): the mHC site 4.1 -> 3.0 us a launch
// (127 KB of code against 19 KB), the embedding gather 8.5 -> 5.3 us; the same treatment of
// the routed experts (routing or given ids), the cluster attention (window keys alone, or
// window then selected) and single projections through the grouped kernel was neutral and is
// not kept.
enum generic_kernel : unsigned {
  generic_mhc = 1u,      // hc_mix_collapse
  generic_gathers = 2u,  // embed_rows, table_rows
  generic_all = 3u,
};
unsigned generic_kernels();  // the calling thread's mask (0: the compiled forms)
// Sets the calling thread's mask for its lifetime, then restores the previous one.
class generic_kernels_scope {
 public:
  explicit generic_kernels_scope(unsigned mask);
  ~generic_kernels_scope();
  generic_kernels_scope(const generic_kernels_scope&) = delete;
  generic_kernels_scope& operator=(const generic_kernels_scope&) = delete;

 private:
  unsigned prev_;
};

}  // namespace cedar::kernels::cuda

// generic_kernels — which form of a kernel the launchers pick (host side, no device code:
// tests and the backend include it directly). See launch.cuh.
#pragma once

namespace cedar::kernels::cuda {

// Generic kernels, for A/B and the tests. Each step launches every hot kernel once per
// multiprocessor, and the step's code does not fit the instruction caches, so a kernel's code is
// fetched from L2 again on most launches: a launch that runs few of its kernel's instructions,
// spread over a large body (every weight format inline, every tail), waits on instruction fetch.
// So the launchers pick a form compiled for the launch's case (hc_fn format and tail; a routed
// or a fixed-id expert launch; a gather's table format; the attention's key mix), computing
// exactly what the generic form computes, unless the case's bit is set in the calling thread's
// mask, which sends it to the one generic kernel of that op instead (the same bits, the old
// code size).
enum generic_kernel : unsigned {
  generic_mhc = 1u,      // hc_mix_collapse
  generic_experts = 2u,  // qgemv_expert (moe_up, moe_up_swiglu, the down projections)
  generic_gathers = 4u,  // embed_rows, table_rows
  generic_attention = 8u,  // sparse_attention's cluster kernel (window keys, or window then selected)
  generic_single = 16u,    // a single projection (qgemv) or pack (norm_rope_pack) through its own
                           // kernel, not the grouped one's
  generic_all = 31u,
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

// bench_cuda_launch — what one dependent step of a decode chain costs before it does any work:
// a chain of N kernels, each waiting for the one before (PDL's griddepcontrol.wait) and adding
// one to a counter the previous one wrote, launched four ways (stream or CUDA graph, with or
// without Programmatic Dependent Launch), against the same N dependent phases inside ONE
// persistent kernel separated by a grid-wide barrier (what a per-layer persistent kernel would
// pay instead of a launch), and the graph + PDL chain with a side branch forked every 4th link.
// Blocks per kernel: 1 and one per multiprocessor. The decode step of
// the 1.2B config is ~210 such links (bench_cuda_decode --profile), so the µs per link times
// that count is the floor the launches put under a step. Checks the counter (N) every time.
//
// Usage: bench_cuda_launch [--links N] [--reps R] [--csv FILE] [--help]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "kernels/cuda/launch.cuh"

namespace kcu = cedar::kernels::cuda;

namespace {

#define CK(x)                                                                          \
  do {                                                                                 \
    const cudaError_t e_ = (x);                                                        \
    if (e_ != cudaSuccess) {                                                           \
      std::fprintf(stderr, "bench_cuda_launch: %s: %s\n", #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)

// One link: block 0's first thread adds one to what the previous link left.
__global__ void link_kernel(int* counter) {
  kcu::pdl_entry();
  if (blockIdx.x == 0 && threadIdx.x == 0) *counter = *counter + 1;
}

// All links in one launch: phase i adds one, then every block waits at a grid-wide barrier
// (arrival counter + generation flag; needs every block resident: a cooperative launch).
__global__ void persistent_kernel(int* counter, unsigned* arrive, volatile unsigned* generation, int links) {
  kcu::pdl_entry();
  for (int i = 0; i < links; ++i) {
    if (blockIdx.x == 0 && threadIdx.x == 0) *counter = *counter + 1;
    __syncthreads();
    if (threadIdx.x == 0) {
      const unsigned gen = *generation;
      __threadfence();
      if (atomicAdd(arrive, 1u) == gridDim.x - 1) {
        *arrive = 0;
        __threadfence();
        atomicAdd(const_cast<unsigned*>(generation), 1u);
      } else {
        while (*generation == gen) {
        }
      }
      __threadfence();
    }
    __syncthreads();
  }
}

struct result {
  std::string mode;
  int blocks;
  double us_per_link;
};

}  // namespace

int main(int argc, char** argv) {
  int links = 200, reps = 20;
  std::string csv_path;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto val = [&](const char* what) -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_cuda_launch: %s needs a value\n", what);
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--help" || a == "-h") {
      std::printf(
          "usage: bench_cuda_launch [--links N] [--reps R] [--csv FILE]\n"
          "The cost of one dependent link of a kernel chain (N links, default 200): stream or CUDA\n"
          "graph launches, with and without Programmatic Dependent Launch, against N phases of one\n"
          "persistent kernel split by grid-wide barriers, and graph + PDL with a side branch (event\n"
          "fork, one-block kernel on a second stream, join) every 4th link; 1 block and one per\n"
          "multiprocessor.\n"
          "Prints us per link and the ratio to graph + PDL. Needs a GPU.\n");
      return 0;
    } else if (a == "--links") {
      links = std::atoi(val("--links").c_str());
    } else if (a == "--reps") {
      reps = std::atoi(val("--reps").c_str());
    } else if (a == "--csv") {
      csv_path = val("--csv");
    } else {
      std::fprintf(stderr, "bench_cuda_launch: unknown option %s (see --help)\n", a.c_str());
      return 2;
    }
  }
  if (links <= 0 || reps <= 0) {
    std::fprintf(stderr, "bench_cuda_launch: --links and --reps must be positive\n");
    return 2;
  }
  int n_dev = 0;
  if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
    std::fprintf(stderr, "bench_cuda_launch: no CUDA device\n");
    return 1;
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s, %d multiprocessors; %d links, best of %d\n", prop.name, prop.multiProcessorCount, links, reps);
  int* counter = nullptr;
  int* side_counter = nullptr;  // the side branches' links (not checked: they only need to run)
  unsigned* bar = nullptr;
  CK(cudaMalloc(&counter, sizeof(int)));
  CK(cudaMalloc(&side_counter, sizeof(int)));
  CK(cudaMalloc(&bar, 2 * sizeof(unsigned)));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t t0, t1;
  CK(cudaEventCreate(&t0));
  CK(cudaEventCreate(&t1));
  std::vector<result> out;
  auto check = [&](const char* mode) {
    int v = 0;
    CK(cudaMemcpy(&v, counter, sizeof v, cudaMemcpyDeviceToHost));
    if (v != links) {
      std::fprintf(stderr, "bench_cuda_launch: %s left the counter at %d, expected %d\n", mode, v, links);
      std::exit(1);
    }
  };
  auto timed = [&](auto&& body) {  // best of reps, ms
    float best = 1e30f;
    for (int r = 0; r <= reps; ++r) {
      CK(cudaMemsetAsync(counter, 0, sizeof(int), s));
      CK(cudaEventRecord(t0, s));
      body();
      CK(cudaEventRecord(t1, s));
      CK(cudaEventSynchronize(t1));
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, t0, t1));
      if (r > 0) best = std::min(best, ms);  // the first is a warm-up
    }
    return best;
  };
  auto graph_timed = [&](auto&& chain) {  // the chain captured into a graph, its launches timed
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    chain();
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    const float ms = timed([&] { CK(cudaGraphLaunch(ge, s)); });
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    return ms;
  };
  for (int blocks : {1, prop.multiProcessorCount}) {
    for (int graph = 0; graph < 2; ++graph) {
      for (int pdl = 0; pdl < 2; ++pdl) {
        kcu::set_pdl(pdl != 0);
        auto chain = [&] {
          for (int i = 0; i < links; ++i) CK(kcu::launch_kernel(link_kernel, blocks, 128, 0, s, counter));
        };
        const float ms = graph ? graph_timed(chain) : timed(chain);
        const std::string mode = std::string(graph ? "graph" : "stream") + (pdl ? " + PDL" : "");
        check(mode.c_str());
        out.push_back({mode, blocks, 1e3 * ms / links});
      }
    }
    // graph + PDL with a side branch every 4th link (as a decode step forks its mHC mixes and
    // L2 lookahead): after link i (i % 4 == 0) an event forks a one-block kernel on a second
    // stream, joined before the next fork; the difference to the plain chain is what the forks
    // cost the main chain (e.g. a kernel after a fork no longer launched early by PDL)
    {
      kcu::set_pdl(true);
      cudaStream_t side;
      cudaEvent_t fork, join;
      CK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
      CK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
      CK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
      int forks = 0;
      auto chain = [&] {
        bool pending = false;
        forks = 0;
        for (int i = 0; i < links; ++i) {
          CK(kcu::launch_kernel(link_kernel, blocks, 128, 0, s, counter));
          if (i % 4 != 0) continue;
          if (pending) CK(cudaStreamWaitEvent(s, join, 0));
          CK(cudaEventRecord(fork, s));
          CK(cudaStreamWaitEvent(side, fork, 0));
          CK(kcu::launch_kernel(link_kernel, 1, 128, 0, side, side_counter));
          CK(cudaEventRecord(join, side));
          pending = true, ++forks;
        }
        if (pending) CK(cudaStreamWaitEvent(s, join, 0));
      };
      const float ms = graph_timed(chain);
      check("graph + PDL, side branches");
      out.push_back({"graph + PDL, fork per 4", blocks, 1e3 * ms / links});
      CK(cudaEventDestroy(fork));
      CK(cudaEventDestroy(join));
      CK(cudaStreamDestroy(side));
    }
    int per_sm = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, persistent_kernel, 128, 0));
    if (per_sm * prop.multiProcessorCount < blocks) {
      std::fprintf(stderr, "bench_cuda_launch: %d blocks cannot all be resident\n", blocks);
      return 1;
    }
    const float ms = timed([&] {
      CK(cudaMemsetAsync(bar, 0, 2 * sizeof(unsigned), s));
      unsigned* gen = bar + 1;
      void* args[] = {&counter, &bar, &gen, &links};
      CK(cudaLaunchCooperativeKernel((const void*)persistent_kernel, blocks, 128, args, 0, s));
    });
    check("persistent");
    out.push_back({"persistent, grid barrier", blocks, 1e3 * ms / links});
  }
  FILE* csv = csv_path.empty() ? nullptr : std::fopen(csv_path.c_str(), "w");
  if (csv) std::fprintf(csv, "device,mode,blocks,links,us_per_link\n");
  for (const result& r : out) {
    double base = 0;
    for (const result& b : out)
      if (b.blocks == r.blocks && b.mode == "graph + PDL") base = b.us_per_link;
    std::printf("  %-26s %4d blocks: %7.3f us per link  (%.2fx graph + PDL)\n", r.mode.c_str(), r.blocks, r.us_per_link,
                r.us_per_link / base);
    if (csv) std::fprintf(csv, "%s,%s,%d,%d,%.4f\n", prop.name, r.mode.c_str(), r.blocks, links, r.us_per_link);
  }
  if (csv) std::fclose(csv);
  return 0;
}

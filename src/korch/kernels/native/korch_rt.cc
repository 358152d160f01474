// korch's native runtime (see korch_rt.h). Built once per machine by
// korch/kernels/native/toolchain.py with the system C++ compiler into libkorch_rt.so,
// against the scipy-openblas32 wheel's OpenBLAS; every native segment links that one
// library, so the process has one pool.
#include "korch_rt.h"

#include <immintrin.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "cblas.h"
#include "korch_gemm.h"

namespace {

int g_threads = 0;  // 0: default_threads()
std::mutex g_err_mu;
std::string g_err;

int g_serial = 0;   // korch_serial: the next TVM kernels run their parallel loops inline

int default_threads() {
  if (const char* e = std::getenv("OMP_NUM_THREADS")) {
    const int n = std::atoi(e);
    if (n > 0) return n;
  }
  // the process's CPUs, read once: a thread holding the pool is pinned to one of them
  // (Note [Pinned threads]), and its own mask then says 1
  static const int cpus = [] {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
    return std::max(1, (int)std::thread::hardware_concurrency());
  }();
  return cpus;
}

int threads() { return g_threads > 0 ? g_threads : default_threads(); }

// Note [One pool, awake for a segment]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// korch's own pool, in place of libgomp's. On the 2-core VM a sleeping worker took
// 67-82 us to wake (libgomp passive, benchmarks/native_dispatch.py), and every parallel
// kernel of a segment paid it: yolo_block's 3x3 convolutions ran 1.5-2.7x slower in
// place than alone. libgomp's spinning pool (GOMP_SPINCOUNT) woke in 4.8 us but kept
// spinning after the segment, against the onnxruntime kernel that ran next (0.46x
// against 0.51x passive, end to end). So:
// - A segment holds the pool for its run (korch_pool_hold): workers woken at its start
//   spin between its kernels and sleep on a futex when it returns.
// - Tasks are claimed, not assigned: a job is (generation, next task) in one atomic
//   word, and whoever is there takes the next task. The calling thread never waits for
//   a worker to wake; a job runs whole on it when none is awake yet.
// - A spinning worker sleeps after SPIN_NS without a job, so a long serial stretch or
//   a hold left open does not take a core for good.
// TVM's parallel barrier needs every task running at once, which claiming does not
// promise: an object asking for it is not linked (segment.py: TVM_HOOKS).
constexpr int64_t SPIN_NS = 2000000;

// Note [Pinned threads]
// ~~~~~~~~~~~~~~~~~~~~~
// The pool's threads spin, and a spinning thread sharing a core with the thread it
// waits for stalls both. Unpinned, Linux put them together often enough: after another
// process's threads had run (the bench alternates engines, each in its own process),
// candy_block took 0.33-0.36 ms a call where it took 0.24 in a loop alone, rounds of
// ten in a row (onnxruntime and OpenVINO, which pin theirs, were not slowed). So worker
// i is pinned to the (i + 1)-th CPU the process may use, and a thread holding the pool
// (an executable's call, a segment: Note [One pool, awake for a segment]) to the
// first, for the hold's length; its own mask comes back when the hold is let go.
// Measured in the bench's alternation, candy_block's saved plan: unpinned 0.33 ms
// (median of ten rounds), workers pinned 0.28, workers and the holding thread 0.26.
// Not done where the pool has more threads than the process has CPUs, nor with
// KORCH_PIN=0 (two korch processes sharing a machine pin their workers alike).
class Pinning {
 public:
  Pinning() {
    const char* e = std::getenv("KORCH_PIN");
    on_ = !(e && std::string(e) == "0") && sched_getaffinity(0, sizeof allowed_, &allowed_) == 0;
    for (int c = 0; on_ && c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &allowed_)) cpus_.push_back(c);
  }

  // whether a pool of `threads` pins
  bool fits(int threads) const { return on_ && threads > 1 && (int)cpus_.size() >= threads; }

  // the calling thread to CPU slot i of the allowed ones
  void pin_self(int i) const {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpus_[(size_t)i], &one);
    sched_setaffinity(0, sizeof one, &one);
  }

  // the holding thread: to slot 0, its mask kept; back to it
  void hold(int threads) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!fits(threads) || held_tid_) return;
    if (sched_getaffinity(0, sizeof saved_, &saved_) != 0) return;
    held_tid_ = (pid_t)syscall(SYS_gettid);
    pin_self(0);
  }

  void release() {
    std::lock_guard<std::mutex> lock(mu_);
    if (!held_tid_) return;
    sched_setaffinity(held_tid_, sizeof saved_, &saved_);
    held_tid_ = 0;
  }

 private:
  bool on_ = false;
  cpu_set_t allowed_{};
  std::vector<int> cpus_;
  std::mutex mu_;
  pid_t held_tid_ = 0;
  cpu_set_t saved_{};
};

Pinning& pinning() {
  static Pinning* p = new Pinning();  // the process's mask before any thread is pinned
  return *p;
}

inline int64_t now_ns() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

class Pool {
 public:
  using Fn = void (*)(void* ctx, int64_t task);

  // runs fn(ctx, i) for i in [0, n) on the calling thread and whichever workers come
  void run(Fn fn, void* ctx, int64_t n, int want) {
    if (n <= 1 || want <= 1 || in_task_ || !launch_.try_lock()) {
      for (int64_t i = 0; i < n; ++i) fn(ctx, i);
      return;
    }
    ensure(want);
    const uint32_t g = gen_ + 1;
    Job& job = jobs_[g & 1];
    job.fn.store(fn, std::memory_order_relaxed);
    job.ctx.store(ctx, std::memory_order_relaxed);
    job.n.store(n, std::memory_order_relaxed);
    done_.store(0, std::memory_order_relaxed);
    state_.store((uint64_t)g << 32, std::memory_order_seq_cst);
    gen_ = g;
    if (sleepers_.load(std::memory_order_seq_cst) > 0) wake();  // they come when they come
    in_task_ = true;
    const int64_t mine = work(g);
    in_task_ = false;
    while (done_.load(std::memory_order_acquire) < n - mine) _mm_pause();
    launch_.unlock();
  }

  void hold(int on) {
    if (on) {
      if (hold_.fetch_add(1, std::memory_order_seq_cst) == 0) {
        if (sleepers_.load(std::memory_order_seq_cst) > 0) wake();
        pinning().hold(threads());  // Note [Pinned threads]
      }
    } else if (hold_.fetch_sub(1, std::memory_order_seq_cst) == 1) {
      pinning().release();
    }
  }

  int holds() const { return hold_.load(); }

  ~Pool() {
    stop_.store(true);
    wake();
    for (auto& t : workers_) t.join();
  }

 private:
  // written by the launcher before it publishes the generation; a worker that read a
  // newer job's fields fails its claim (the generation moved on)
  struct Job {
    std::atomic<Fn> fn{nullptr};
    std::atomic<void*> ctx{nullptr};
    std::atomic<int64_t> n{0};
  };

  // claims and runs tasks of job g until none is left; returns how many it ran
  int64_t work(uint32_t g) {
    const Job& job = jobs_[g & 1];
    int64_t ran = 0;
    uint64_t s = state_.load(std::memory_order_acquire);
    for (;;) {
      if ((uint32_t)(s >> 32) != g || (int64_t)(s & 0xffffffffu) >= job.n.load(std::memory_order_relaxed)) return ran;
      Fn fn = job.fn.load(std::memory_order_relaxed);
      void* ctx = job.ctx.load(std::memory_order_relaxed);
      if (!state_.compare_exchange_weak(s, s + 1, std::memory_order_acq_rel, std::memory_order_acquire)) continue;
      fn(ctx, (int64_t)(s & 0xffffffffu));
      ++ran;
      if (!in_task_) done_.fetch_add(1, std::memory_order_release);
      s = state_.load(std::memory_order_acquire);
    }
  }

  void worker() {
    uint32_t seen = (uint32_t)(state_.load() >> 32);
    int64_t idle_since = now_ns();
    int spins = 0;
    for (;;) {
      const uint32_t g = (uint32_t)(state_.load(std::memory_order_acquire) >> 32);
      if (g != seen) {
        seen = g;
        work(g);
        idle_since = now_ns();
        continue;
      }
      if (stop_.load(std::memory_order_relaxed)) return;
      if (hold_.load(std::memory_order_relaxed) > 0 && (++spins & 1023 || now_ns() - idle_since < SPIN_NS)) {
        _mm_pause();
        continue;
      }
      const uint32_t e = epoch_.load(std::memory_order_seq_cst);
      sleepers_.fetch_add(1, std::memory_order_seq_cst);
      if ((uint32_t)(state_.load(std::memory_order_seq_cst) >> 32) == seen && !stop_.load() &&
          (hold_.load(std::memory_order_seq_cst) == 0 || now_ns() - idle_since >= SPIN_NS))
        syscall(SYS_futex, reinterpret_cast<uint32_t*>(&epoch_), FUTEX_WAIT_PRIVATE, e, nullptr, nullptr, 0);
      sleepers_.fetch_sub(1, std::memory_order_seq_cst);
      idle_since = now_ns();
    }
  }

  void wake() {
    epoch_.fetch_add(1, std::memory_order_seq_cst);
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&epoch_), FUTEX_WAKE_PRIVATE, INT32_MAX, nullptr, nullptr, 0);
  }

  // the pool has want - 1 workers (the caller is the last thread)
  void ensure(int want) {
    if ((int)workers_.size() == want - 1) return;
    if (!workers_.empty()) {  // resized (korch_set_threads): the old workers leave first
      stop_.store(true);
      wake();
      for (auto& t : workers_) t.join();
      workers_.clear();
      stop_.store(false);
    }
    const bool pin = pinning().fits(want);  // Note [Pinned threads]
    for (int i = 0; i < want - 1; ++i)
      workers_.emplace_back([this, pin, i] {
        if (pin) pinning().pin_self(i + 1);
        worker();
      });
  }

  std::atomic<uint64_t> state_{0};  // generation << 32 | next task
  std::atomic<int64_t> done_{0};    // tasks of the current job the workers finished
  std::atomic<uint32_t> epoch_{0};  // the futex word sleepers wait on
  std::atomic<int> sleepers_{0};
  std::atomic<int> hold_{0};
  std::atomic<bool> stop_{false};
  Job jobs_[2];
  uint32_t gen_ = 0;  // the launcher's own copy of the generation
  std::mutex launch_;  // one job at a time; a second launcher runs its job inline
  std::vector<std::thread> workers_;
  static thread_local bool in_task_;
};

thread_local bool Pool::in_task_ = false;

Pool& pool() {
  static Pool* p = new Pool();  // never destroyed: workers may outlive static destructors
  return *p;
}

// f(t) for t in [0, n) over T threads of the pool (inline when T is 1)
template <class F>
void parallel_for(int64_t n, int T, F&& f) {
  if (T <= 1 || n <= 1) {
    for (int64_t t = 0; t < n; ++t) f(t);
    return;
  }
  using Fd = std::remove_reference_t<F>;
  pool().run([](void* c, int64_t t) { (*static_cast<Fd*>(c))(t); }, &f, n, T);
}

// Note [Serial small kernels]: a kernel that runs in less than about twice a parallel
// job's cost on one thread stays on the calling thread. The thresholds (this one, and
// SERIAL_BYTES in segment.py) were set when a job cost libgomp's wake-up; on korch's
// held pool a job's hand-off costs 0.3-1.1 us (timed in C++ around
// korch_parallel_launch on a 2-core Zen 4 VM), so they are conservative. Lowering them
// did not help mobilenetv3_small: its small elementwise kernels are slow on two threads
// because their input was written by the other core, not because of the hand-off.
// A GEMV does two FLOPs a weight, so 1.5 MFLOP is 3 MB of weights read once: memory
// bound, at about 30 GB/s a core from L3. So weights past SERIAL_WEIGHT_BYTES go
// parallel whatever the FLOPs (mobilenetv3_small's 576 -> 1024 head on one pixel, 2.4
// MB: 75 us on one thread in place).
constexpr double SERIAL_FLOPS = 1.5e6, SERIAL_WEIGHT_BYTES = 256 * 1024;

// Note [Balanced batches]
// ~~~~~~~~~~~~~~~~~~~~~~~
// A batched matmul is shared out as (batch, part) tasks. With one part a matrix, three
// attention heads on two threads ran as two rounds, the second on one thread: 1.5x
// the balanced time (deit_tiny's q k^T and attention-times-v, 3 x 197 x 197 x 64, ran
// 114 us where two even halves take ~80). A matrix is split into T / gcd(batch, T)
// parts whenever the rounds would not come out even and there are few of them; past
// eight rounds the last one's idle threads cost under 1/8 and a matrix is kept whole.
inline int64_t batch_parts(int64_t batch, int T) {
  if (batch % T == 0) return 1;
  if (batch >= 8 * T) return 1;
  int64_t a = batch, b = T;
  while (b) a %= b, std::swap(a, b);
  return T / a;
}

// Note [Direct convolution bands]: a band holds up to this many register tiles (6 x 16
// floats each: 96 tiles are 36 KB, summed over K where L1 and L2 keep them)
constexpr int64_t BAND_TILES = 96;

// --- epilogue --------------------------------------------------------------------------
// op codes shared with linear.py
enum Code : int64_t {
  ADD = 1, SUB = 2, MUL = 3, DIV = 4, MAX = 5, MIN = 6,
  NEG = 11, EXP = 12, TANH = 13, SIGMOID = 14, ABS = 15, ERF = 16,
  STORE = 20,
};

struct Step {
  // kind 0 unary, 1 scalar, 2 tensor operand (input pos), 3 store (output pos), 4 save
  // (to slot pos), 5 saved operand (slot pos), 6 pool (output pos: Note [Pooled taps]),
  // 7 the conv input's scale (input pos, strides over the input: Note [Scaled inputs]),
  // 8 a step making that scale (pos 0 unary, 1 scalar)
  int64_t op, kind, left, pos;
  float scalar;
  std::vector<int64_t> strides;  // tensor operand: element strides over the output's dims
};

// Note [Pooled taps]
// ~~~~~~~~~~~~~~~~~~
// A convolution's kernel may also output the mean of a chain value over each channel
// plane (N x C values): squeeze-and-excitation pools the activation a depthwise conv
// just wrote (efficientnet_b0, MobileNetV3). As a kernel of its own that pool
// re-read the plane from memory, often from the other core's cache (144 x 56 x 56:
// 80 us alone, 159 us in place). A pool step sums each epilogue chunk while it is in
// L1 and adds the sum to its channel's total; the run zeroes the totals before and
// divides them after. Depthwise convs only, each plane one task (one band of rows):
// with bands split over threads the sums met in whatever order the tasks ran, and the
// same inputs gave means differing in the last bits from call to call (196 of 200
// calls on 144 x 56 x 56). The add stays atomic for safety; it has one writer.
// Rows never cross a channel plane where a kernel pools (plan_rows). Where nothing
// but the pools reads the chain (a classifier head's conv, activation and global
// pool), the conv's value goes to scratch: the main output is then nout, past the
// outputs.
inline void atomic_add(float* p, float v) {
  uint32_t* u = reinterpret_cast<uint32_t*>(p);
  uint32_t old = __atomic_load_n(u, __ATOMIC_RELAXED), nw;
  do {
    float f;
    std::memcpy(&f, &old, sizeof f);
    f += v;
    std::memcpy(&nw, &f, sizeof f);
  } while (!__atomic_compare_exchange_n(u, &old, nw, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
}

inline float sum_floats(const float* __restrict v, int64_t n) {
  int64_t j = 0;
  float s = 0.0f;
#if defined(__AVX2__)
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
  for (; j + 32 <= n; j += 32) {
    a0 = _mm256_add_ps(a0, _mm256_loadu_ps(v + j));
    a1 = _mm256_add_ps(a1, _mm256_loadu_ps(v + j + 8));
    a2 = _mm256_add_ps(a2, _mm256_loadu_ps(v + j + 16));
    a3 = _mm256_add_ps(a3, _mm256_loadu_ps(v + j + 24));
  }
  for (; j + 8 <= n; j += 8) a0 = _mm256_add_ps(a0, _mm256_loadu_ps(v + j));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  for (float x : lanes) s += x;
#endif
  for (; j < n; ++j) s += v[j];
  return s;
}

// y = x * s over n floats (restrict: vectorized, no alias check)
inline void scale_row(const float* __restrict x, float* __restrict y, int64_t n, float s) {
  for (int64_t j = 0; j < n; ++j) y[j] = x[j] * s;
}

inline float bin(int64_t op, float v, float o, bool left) {
  float x = left ? v : o, y = left ? o : v;
  switch (op) {
    case ADD: return x + y;
    case SUB: return x - y;
    case MUL: return x * y;
    case DIV: return x / y;
    case MAX: return x > y ? x : y;
    default: return x < y ? x : y;  // MIN
  }
}

template <int64_t OP>
inline void bin_loop(float* __restrict v, int64_t n, const float* __restrict o, int64_t s, bool left) {
  if (s == 1) {
    if (left) for (int64_t j = 0; j < n; ++j) v[j] = bin(OP, v[j], o[j], true);
    else for (int64_t j = 0; j < n; ++j) v[j] = bin(OP, v[j], o[j], false);
  } else if (s == 0) {
    const float c = o[0];
    if (left) for (int64_t j = 0; j < n; ++j) v[j] = bin(OP, v[j], c, true);
    else for (int64_t j = 0; j < n; ++j) v[j] = bin(OP, v[j], c, false);
  } else {
    for (int64_t j = 0; j < n; ++j) v[j] = bin(OP, v[j], o[j * s], left);
  }
}

void binary(int64_t op, float* v, int64_t n, const float* o, int64_t s, bool left) {
  switch (op) {
    case ADD: bin_loop<ADD>(v, n, o, s, left); break;
    case SUB: bin_loop<SUB>(v, n, o, s, left); break;
    case MUL: bin_loop<MUL>(v, n, o, s, left); break;
    case DIV: bin_loop<DIV>(v, n, o, s, left); break;
    case MAX: bin_loop<MAX>(v, n, o, s, left); break;
    default: bin_loop<MIN>(v, n, o, s, left); break;
  }
}

#if defined(__AVX2__) && defined(__FMA__)
// Note [Vector transcendentals]: expf and tanhf are libm calls that GCC does not
// vectorize without -ffast-math (a SiLU epilogue ran one expf per element). These are
// the generated kernels' formulas (korch/kernels/tvm/fastmath.py: Cephes exp, Eigen's
// tanh), eight lanes at a time; the same error bounds.
using korch_gemm::exp8;  // korch_gemm.h: Note [Register post-ops] needs it too

inline __m256 tanh8(__m256 x) {
  const __m256 c = _mm256_set1_ps(7.90531110763549805f);
  x = _mm256_max_ps(_mm256_min_ps(x, c), _mm256_sub_ps(_mm256_setzero_ps(), c));
  const __m256 x2 = _mm256_mul_ps(x, x);
  __m256 p = _mm256_set1_ps(-2.76076847742355e-16f);
  for (float k : {2.00018790482477e-13f, -8.60467152213735e-11f, 5.12229709037114e-08f, 1.48572235717979e-05f,
                  6.37261928875436e-04f, 4.89352455891786e-03f})
    p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(k));
  __m256 q = _mm256_set1_ps(1.19825839466702e-06f);
  for (float k : {1.18534705686654e-04f, 2.26843463243900e-03f, 4.89352518554385e-03f})
    q = _mm256_fmadd_ps(q, x2, _mm256_set1_ps(k));
  return _mm256_div_ps(_mm256_mul_ps(x, p), q);
}

using korch_gemm::erf8;

// v[0, n) through op eight at a time; returns how many it did (the rest is scalar)
inline int64_t unary8(int64_t op, float* __restrict v, int64_t n) {
  if (op != EXP && op != TANH && op != SIGMOID && op != ERF) return 0;
  const __m256 one = _mm256_set1_ps(1.0f);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 x = _mm256_loadu_ps(v + j);
    __m256 y;
    if (op == EXP) y = exp8(x);
    else if (op == TANH) y = tanh8(x);
    else if (op == ERF) y = erf8(x);
    else y = _mm256_div_ps(one, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), x))));
    _mm256_storeu_ps(v + j, y);
  }
  return j;
}
#else
inline int64_t unary8(int64_t, float*, int64_t) { return 0; }
#endif

void unary(int64_t op, float* __restrict v, int64_t n) {
  const int64_t done = unary8(op, v, n);
  v += done;
  n -= done;
  switch (op) {
    case NEG: for (int64_t j = 0; j < n; ++j) v[j] = -v[j]; break;
    case EXP: for (int64_t j = 0; j < n; ++j) v[j] = std::exp(v[j]); break;
    case TANH: for (int64_t j = 0; j < n; ++j) v[j] = std::tanh(v[j]); break;
    case SIGMOID: for (int64_t j = 0; j < n; ++j) v[j] = 1.0f / (1.0f + std::exp(-v[j])); break;
    case ERF: for (int64_t j = 0; j < n; ++j) v[j] = std::erf(v[j]); break;
    default: for (int64_t j = 0; j < n; ++j) v[j] = std::fabs(v[j]); break;  // ABS
  }
}

// --- the kernel ------------------------------------------------------------------------
// the first 64-byte boundary at or after p (scratch vectors hold 16 floats more)
inline float* align64(float* p) {
  return reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(p) + 63) & ~uintptr_t(63));
}

#if defined(__AVX512F__)
// lane l takes lane 2l of (a, b) in _mm512_permutex2var_ps: the even floats of 32
inline __m512i even_lanes() { return _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0); }
#endif

struct Linear {
  int64_t op = 0, nin = 0, nout = 1, main = 0, a = 0, b = 0, b_const = 0;
  // the weights packed for korch_gemm on the first call (b_const: they never change)
  mutable std::mutex pack_mu;
  mutable std::vector<float> packed;
  mutable const float* packed_from = nullptr;
  std::vector<int64_t> oshape;
  // matmul: out[batch, M, N] = A[aoff + (M, K)] @ B[boff + (K, N)]
  int64_t batch = 0, M = 0, K = 0, N = 0;
  std::vector<int64_t> aoff, boff;
  // conv (2-D, NCHW, weights [Co, C/group, kh, kw])
  int64_t n = 0, c = 0, h = 0, w = 0, co = 0, kh = 0, kw = 0, sh = 0, sw = 0, dh = 0, dw = 0, pt = 0, pl = 0,
          group = 0, ho = 0, wo = 0;
  int64_t pad_mode = 0;  // the conv's padding: 0 zeros, 1 reflected, 2 the edge (Note [Reflected padding])
  std::vector<Step> epi;
  bool pools = false;  // a step of kind 6 (Note [Pooled taps])
  mutable std::vector<float> scratch_out;  // the main output where only its pools are (main == nout)
  mutable std::vector<void*> call_ptrs;    // conv_around's arguments, scratch_out or scaled in place
  int64_t slots = 0;  // rows of scratch the chain saves values to (kind 4) and reads back (5)

  // Note [Epilogue rows]
  // ~~~~~~~~~~~~~~~~~~~~~
  // The epilogue runs over rows of the output: the trailing dims over which every
  // tensor operand is either contiguous or constant, merged (Note [Coalesced axes] in
  // korch/kernels/tvm/coalesce.py; the same rule). A per-channel bias over NCHW makes
  // each channel's H x W plane one row. Before, a row was the last dim alone: a
  // [1, 576, 7, 7] output ran its bias, activation and residual steps 4032 times on
  // 7 elements, with a division per row. A row is cut into chunks of EPI_CHUNK, so a
  // chain's saved values (kind 4) stay in L1.
  static constexpr int64_t EPI_CHUNK = 1024;
  int64_t erow = 0, eouter = 0;  // the row length, and how many leading dims index rows

  void plan_rows() {
    const int64_t D = (int64_t)oshape.size();
    int64_t d = D - 1, L = oshape[(size_t)(D - 1)];
    for (; d > 0; --d) {
      if (pools && d <= 2) break;  // Note [Pooled taps]: a row within one channel plane
      bool ok = true;
      for (const Step& s : epi)
        if (s.kind == 2 && s.strides[(size_t)(d - 1)] != s.strides[(size_t)d] * oshape[(size_t)d]) ok = false;
      if (!ok) break;
      L *= oshape[(size_t)(d - 1)];
    }
    erow = L, eouter = d;
  }

  // Note [Register post-ops] (korch_gemm.h): how the chain's head maps onto one, if it
  // does. Bias: a tensor ADD whose operand varies only along the channel (a conv's dim
  // 1). Then scalar MUL, ADD and right SUB (the affine map), then
  // MAX/MIN (the clamp), or a SIGMOID alone, all optionally between a save and a MUL by
  // the saved value (the gate), that slot read nowhere else.
  korch_gemm::Post post_spec;       // without its bias pointer (an input, known per call)
  int64_t post_bias_pos = -1, post_bias_stride = 0;
  int64_t post_sum_pos = -1;  // Note [Residual in registers]: the input added after the bias
  size_t post_steps = 0;            // epilogue steps it does; 0: none

  void plan_post() {
    // convolutions (channels: dim 1), and a MatMul through the packed AVX-512 GEMM
    // (channels: the last dim); the other matmul paths do not apply one
    const int64_t D = (int64_t)oshape.size();
    if (D < 2) return;
    if (op == 0 && !(korch_gemm::wide && packed_matmul())) return;
    const int64_t chan = op == 0 ? D - 1 : 1;
    size_t i = 0;
    if (i < epi.size() && epi[i].kind == 2 && epi[i].op == ADD) {
      bool ok = true;
      for (int64_t d = 0; d < D; ++d)
        if (d != chan && epi[i].strides[(size_t)d] != 0 && oshape[(size_t)d] != 1) ok = false;
      if (ok) post_bias_pos = epi[i].pos, post_bias_stride = epi[i].strides[(size_t)chan], ++i;
    }
    if (op == 0 && post_bias_pos >= 0 && post_bias_stride != 1) {  // post_for copies conv channels only
      post_bias_pos = -1;
      return;
    }
    // Note [Residual in registers]: a tensor laid out as the output, where the conv runs
    // as conv_pointwise or conv_winograd (each stores whole rows of the output)
    const auto residual = [&](size_t at) {
      if (op != 1 || !korch_gemm::wide || at >= epi.size() || epi[at].kind != 2 || epi[at].op != ADD || !sum_path())
        return false;
      for (int64_t d = D - 1, stride = 1; d >= 0; stride *= oshape[(size_t)d], --d)
        if (oshape[(size_t)d] != 1 && epi[at].strides[(size_t)d] != stride) return false;
      return true;
    };
    if (residual(i)) post_sum_pos = epi[i].pos, ++i;
    bool activation = false;
    // the activation, with the gate (a save first) and without
    for (int gated = 1; gated >= 0; --gated) {
      size_t j = i;
      int64_t slot = -1;
      if (gated) {
        if (j >= epi.size() || epi[j].kind != 4) continue;
        slot = epi[j++].pos;
      }
      float ga = 1.0f, gb = 0.0f, lo = -INFINITY, hi = INFINITY, ea = 1.0f, eb = 0.0f, os = 1.0f;
      bool clamp = false, sigmoid = false, erf = false;
      if (j < epi.size() && epi[j].kind == 0 && epi[j].op == SIGMOID) sigmoid = true, ++j;
      for (; !sigmoid && j < epi.size() && epi[j].kind == 1; ++j) {
        const Step& st = epi[j];
        const float v = st.scalar;
        if (!clamp && st.op == MUL) ga *= v, gb *= v;
        else if (!clamp && st.op == DIV && st.left && v != 0.0f) ga /= v, gb /= v;
        else if (!clamp && st.op == ADD) gb += v;
        else if (!clamp && st.op == SUB && st.left) gb -= v;
        else if (st.op == MAX) lo = std::max(lo, v), hi = std::max(hi, v), clamp = true;
        else if (st.op == MIN) lo = std::min(lo, v), hi = std::min(hi, v), clamp = true;
        else break;
      }
      // GELU's erf form (Note [Register post-ops]): erf of the affine map, then another
      if (!sigmoid && !clamp && j < epi.size() && epi[j].kind == 0 && epi[j].op == ERF) {
        erf = true, ++j;
        for (; j < epi.size() && epi[j].kind == 1; ++j) {
          const Step& st = epi[j];
          const float v = st.scalar;
          if (st.op == MUL) ea *= v, eb *= v;
          else if (st.op == ADD) eb += v;
          else if (st.op == SUB && st.left) eb -= v;
          else break;
        }
      }
      if (!clamp && !sigmoid && !erf) continue;  // an affine map alone is left to the rows
      if (gated) {
        if (j >= epi.size() || epi[j].kind != 5 || epi[j].op != MUL || epi[j].pos != slot) continue;
        bool read_again = false;
        for (size_t q = j + 1; q < epi.size(); ++q)
          if (epi[q].kind == 5 && epi[q].pos == slot) read_again = true;
        if (read_again) continue;
        ++j;
      }
      if (erf)  // GELU's 0.5 after the product
        for (; j < epi.size() && epi[j].kind == 1 && epi[j].op == MUL; ++j) os *= epi[j].scalar;
      post_spec.clamp = clamp, post_spec.sigmoid = sigmoid, post_spec.gate = gated != 0;
      post_spec.erf = erf, post_spec.ea = ea, post_spec.eb = eb, post_spec.os = os, post_spec.scaled = os != 1.0f;
      post_spec.affine = ga != 1.0f || gb != 0.0f;
      post_spec.ga = ga, post_spec.gb = gb, post_spec.lo = lo, post_spec.hi = hi;
      i = j, activation = true;
      break;
    }
    // or after the activation (YOLOv5's bottleneck: SiLU, then the shortcut)
    if (post_sum_pos < 0 && activation && residual(i)) post_sum_pos = epi[i].pos, post_spec.sum_after = true, ++i;
    post_steps = i;
  }

  // the Post for one call: the bias made contiguous in buf where its stride is not 1
  korch_gemm::Post post_for(void* const* ptrs, std::vector<float>& buf) const {
    korch_gemm::Post p = post_spec;
    if (post_sum_pos >= 0) p.sum = static_cast<const float*>(ptrs[post_sum_pos]);
    if (post_bias_pos >= 0) {
      const float* b = static_cast<const float*>(ptrs[post_bias_pos]);
      if (post_bias_stride == 1) {
        p.bias = b;
      } else {
        buf.resize((size_t)co);
        for (int64_t ch = 0; ch < co; ++ch) buf[(size_t)ch] = b[ch * post_bias_stride];
        p.bias = buf.data();
      }
    }
    return p;
  }

  // the epilogue on output elements [begin, end), from step `from` on (the steps
  // before it done in registers: Note [Register post-ops])
  void epilogue(float* out, void* const* ptrs, int64_t begin, int64_t end, size_t from = 0) const {
    if (epi.size() <= from) return;
    const int64_t D = (int64_t)oshape.size(), L = erow;
    thread_local std::vector<float> scratch;
    if ((int64_t)scratch.size() < slots * EPI_CHUNK) scratch.resize((size_t)(slots * EPI_CHUNK));
    for (int64_t f = begin; f < end;) {
      const int64_t r = f / L, c0 = f % L, len = std::min({L - c0, end - f, EPI_CHUNK});
      float* v = out + f;
      for (size_t si = from; si < epi.size(); ++si) {
        const Step& s = epi[si];
        if (s.kind == 3) {
          std::memcpy(static_cast<float*>(ptrs[nin + s.pos]) + f, v, sizeof(float) * len);
        } else if (s.kind == 6) {  // Note [Pooled taps]
          atomic_add(static_cast<float*>(ptrs[nin + s.pos]) + f / (oshape[2] * oshape[3]), sum_floats(v, len));
        } else if (s.kind == 4) {
          std::memcpy(scratch.data() + s.pos * EPI_CHUNK, v, sizeof(float) * len);
        } else if (s.kind == 5) {
          binary(s.op, v, len, scratch.data() + s.pos * EPI_CHUNK, 1, s.left != 0);
        } else if (s.kind == 0) {
          unary(s.op, v, len);
        } else if (s.kind == 1) {
          binary(s.op, v, len, &s.scalar, 0, s.left != 0);
        } else {
          int64_t off = c0 * s.strides[D - 1], rr = r;
          for (int64_t d = eouter - 1; d >= 0; --d) {
            off += (rr % oshape[d]) * s.strides[d];
            rr /= oshape[d];
          }
          binary(s.op, v, len, static_cast<const float*>(ptrs[s.pos]) + off, s.strides[D - 1], s.left != 0);
        }
      }
      f += len;
    }
  }

  // topk (op 2): along an axis of length L, between outer and inner extents
  int64_t tk_outer = 0, tk_len = 0, tk_inner = 0, tk_k = 0, tk_largest = 1;
  std::vector<int64_t> tk_which;  // per output: 0 the values (float32), 1 the indices (int64)

  // pool (op 3): the conv's geometry (co unused), the max or the sum of each window
  int64_t pool_max = 1;
  float pool_div = 1.0f;  // the sum divided by this (an AveragePool's window size)

  int run(void* const* ptrs) const {
    if (op == 1 && (pools || a_scale >= 0)) return conv_around(ptrs);
    return op == 0 ? matmul(ptrs) : op == 1 ? conv(ptrs) : op == 2 ? topk(ptrs) : op == 3 ? pool(ptrs) : op == 4 ? softmax(ptrs) : op == 6 ? copy(ptrs) : op == 7 ? layernorm(ptrs) : transpose(ptrs);
  }

  // a conv with pools (Note [Pooled taps]: totals from zero, divided after; the value
  // in scratch where only they read it) or an input scale (Note [Scaled inputs])
  int conv_around(void* const* ptrs) const {
    std::vector<void*>& p = call_ptrs;  // reused: no allocation a call
    p.assign(ptrs, ptrs + nin + nout);
    if (main == nout) {
      scratch_out.resize((size_t)(n * co * ho * wo));
      p.push_back(scratch_out.data());
    }
    if (a_scale >= 0) scale_input(p.data());
    for (const Step& s : epi)
      if (s.kind == 6) std::memset(ptrs[nin + s.pos], 0, sizeof(float) * (size_t)(n * co));
    const int rc = conv(p.data());
    panel_scale = nullptr;
    for (const Step& s : epi)
      if (s.kind == 6)
        for (int64_t i = 0; i < n * co; ++i) static_cast<float*>(ptrs[nin + s.pos])[i] /= s.scalar;
    return rc;
  }

  // Note [Scaled inputs]
  // ~~~~~~~~~~~~~~~~~~~~
  // Squeeze-and-excitation scales each channel of a depthwise conv's output by a number
  // per image, then a 1x1 conv projects it. As a kernel of its own the scale re-read
  // and re-wrote the whole activation (efficientnet_b0: 144 x 56 x 56, 128 us in
  // place). Folded into the conv, it scales whichever is smaller: the packed weights
  // (P[panel, k, lane] * s[k / taps], one image only; the panels packed once, the scaled
  // copy made this call), 24 x 144 numbers there against 144 x 3136, or else a copy of
  // the input. The weights were first scaled unpacked and packed again each call: the
  // pack (a transpose, scalar) doubled the 672 -> 112 projection on 14 x 14 (133-144
  // unscaled, 269 us scaled on two threads; scaling the panels, 152-154 us).
  int64_t a_scale = -1, as_n = 0, as_c = 0;  // the scale's input pos and strides (image, channel)
  std::vector<Step> scale_chain;             // the steps making the scale from it (a sigmoid, say)
  mutable std::vector<float> scaled, scale;  // this call's scaled panels or input; its scale
  mutable std::vector<float> gathered;       // the pixels a strided 1x1 conv reads (Note [Strided pointwise])
  mutable const float* panel_scale = nullptr;  // this call's scale per input channel, when on the panels

  // the convs whose weights are packed panels ([panel][k][lanes], k the reduction index)
  bool packed_weights() const {
    return korch_gemm::available && b_const && !(c / group == 1 && co / group == 1) && !row_conv();
  }

  // packed panels P (groups of `per` floats, [panel][K][lanes]) times panel_scale on k:
  // the scale of input channel k / taps of the group; P itself where no scale is on
  const float* scale_panels(const float* P, int64_t per, int64_t K, int64_t lanes) const {
    if (!panel_scale) return P;
    const int64_t cig = c / group, taps = K / cig, panels = per / (K * lanes);
    scaled.resize((size_t)(per * group + 16));
    float* out = align64(scaled.data());
    thread_local std::vector<float> sx;  // a panel's [K][lanes] of scales: one flat product a panel
    sx.resize((size_t)(K * lanes));
    for (int64_t g = 0; g < group; ++g) {
      for (int64_t k = 0; k < K; ++k) std::fill_n(sx.begin() + k * lanes, lanes, panel_scale[g * cig + k / taps]);
      for (int64_t pn = 0; pn < panels; ++pn) {
        const float* src = P + g * per + pn * K * lanes;
        float* dst = out + g * per + pn * K * lanes;
        for (int64_t i = 0; i < K * lanes; ++i) dst[i] = src[i] * sx[(size_t)i];
      }
    }
    return out;
  }

  // the weights as korch_gemm's packed right operand ([Co/group, K] per group), scaled
  const float* panels_b(const float* W) const {
    const int64_t cog = co / group, KK = (c / group) * kh * kw;
    return scale_panels(pack(W, group, cog * KK, KK, cog, 1, KK), korch_gemm::packed_size(KK, cog), KK, korch_gemm::NR);
  }

  void scale_input(void** p) const {
    const float* S = static_cast<const float*>(p[a_scale]);
    int64_t sn = as_n, sc = as_c;
    scale.resize((size_t)(n * c));
    if (!scale_chain.empty() || sc != 1) {  // the scale made first: n x c numbers
      for (int64_t t = 0; t < n * c; ++t) scale[(size_t)t] = S[(t / c) * as_n + (t % c) * as_c];
      for (const Step& st : scale_chain) {
        if (st.pos == 0) unary(st.op, scale.data(), n * c);
        else binary(st.op, scale.data(), n * c, &st.scalar, 0, st.left != 0);
      }
      S = scale.data(), sn = c, sc = 1;
    }
    const int64_t cig = c / group, taps = kh * kw, HW = h * w;
    if (n == 1 && packed_weights() && 3 * co * cig * taps <= 2 * c * HW) {  // scaling the packed weights
      panel_scale = S;
      return;
    }
    scaled.resize((size_t)(n * c * HW + 16));
    const float* X = static_cast<const float*>(p[a]);
    float* Xs = align64(scaled.data());
    const int T = n * c * HW < 16384 ? 1 : threads();  // a task a thread: a claim is an atomic
    parallel_for(T, T, [&](int64_t part) {
      for (int64_t t = n * c * part / T; t < n * c * (part + 1) / T; ++t)
        scale_row(X + t * HW, Xs + t * HW, HW, S[(t / c) * sn + (t % c) * sc]);
    });
    p[a] = Xs;
  }

  // Note [Native pooling]
  // ~~~~~~~~~~~~~~~~~~~~~
  // MaxPool, and AveragePool with one divisor, over NCHW planes: fission's PAD +
  // WINDOW + REDUCE_MAX/SUM + RESHAPE (+ DIV) as one step. Each plane is first copied
  // into a padded one (the padding -inf for a max, 0 for a sum), so that every tap of
  // every output is a plain load: 16 columns a vector (AVX-512), stride 1 one load,
  // stride 2 two loads deinterleaved, other strides scalar; the window's width is a
  // template argument for 2, 3 and 5. TVM's nest for resnet18's 3x3 stride-2 max pool
  // kept the pad as a bounds test per element and ran scalar (Note [Window reductions
  // stay scalar] in its scheduler): 352 us in place, onnxruntime's 83. Tried and
  // dropped: the edge columns as gathers (16 cycles a gather on this Zen 4) or as
  // masked loads with computed masks, and scalar edges (most of a 5x5 pool's time over
  // 20x20 planes). Both backends are measured; the faster one is chosen. On the Intel
  // Xeon, rows read in place with the pad masked (no copy) ran slower again: resnet18's
  // pool 177-189 -> 262-296 us alone, the 5x5 over 32x32 21 -> 56-63.

  int pool(void* const* ptrs) const {
    const float* X = static_cast<const float*>(ptrs[a]);
    float* Y = static_cast<float*>(ptrs[nin + main]);
    const bool mx = pool_max != 0;
    // S: the column stride as the vector loop loads it (1; 2, two loads deinterleaved;
    // 0, any other: scalar); KW: the window's width, when it is a common one
    auto go = [&](auto s, auto kwc) {
      if (mx) pool_planes<decltype(s)::value, decltype(kwc)::value, true>(X, Y);
      else pool_planes<decltype(s)::value, decltype(kwc)::value, false>(X, Y);
    };
    using I = std::integral_constant<int, 0>;
    auto by_width = [&](auto s) {
      if (kw == 2) go(s, std::integral_constant<int, 2>{});
      else if (kw == 3) go(s, std::integral_constant<int, 3>{});
      else if (kw == 5) go(s, std::integral_constant<int, 5>{});
      else go(s, I{});
    };
#if defined(__AVX512F__)
    if (sw == 1) by_width(std::integral_constant<int, 1>{});
    else if (sw == 2) by_width(std::integral_constant<int, 2>{});
    else by_width(I{});
#else
    by_width(I{});
#endif
    return 0;
  }

  template <int S, int KW, bool MX>
  void pool_planes(const float* X, float* Y) const {
    const float init = MX ? -INFINITY : 0.0f;
    const int64_t kwn = KW ? KW : kw;
    // the padded plane: every tap of every output inside, the padding the value that
    // changes nothing; 32 more floats a row for the vector loads past the last column
    const int64_t Hp = std::max(h + pt, (ho - 1) * sh + (kh - 1) * dh + 1);
    const int64_t Wp = std::max(w + pl, (wo - 1) * sw + (kwn - 1) * dw + 1) + 32;
    const int64_t planes = n * c;
    const int T = (double)planes * ho * wo * kh * kwn < SERIAL_FLOPS ? 1 : threads();
    parallel_for(planes, T, [&](int64_t p) {
      static thread_local std::vector<float> padded;
      padded.resize((size_t)(Hp * Wp));
      float* P = padded.data();
      const float* xp = X + p * h * w;
      std::fill(P, P + pt * Wp, init);
      for (int64_t y = 0; y < h; ++y) {
        float* d = P + (y + pt) * Wp;
        std::fill(d, d + pl, init);
        std::memcpy(d + pl, xp + y * w, sizeof(float) * w);
        std::fill(d + pl + w, d + Wp, init);
      }
      std::fill(P + (h + pt) * Wp, P + Hp * Wp, init);
      float* yp = Y + p * ho * wo;
      for (int64_t oy = 0; oy < ho; ++oy) {
        const float* r0 = P + oy * sh * Wp;
        float* yr = yp + oy * wo;
        int64_t ox = 0;
#if defined(__AVX512F__)
        if constexpr (S == 1 || S == 2) {
          const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
          const __m512 vdiv = _mm512_set1_ps(pool_div);
          for (; ox < wo; ox += 16) {
            const __mmask16 mk = (__mmask16)((1u << std::min<int64_t>(16, wo - ox)) - 1);
            __m512 acc = _mm512_set1_ps(init);
            for (int64_t ky = 0; ky < kh; ++ky) {
              const float* src0 = r0 + ky * dh * Wp + ox * S;
              for (int64_t kx = 0; kx < kwn; ++kx) {
                const float* src = src0 + kx * dw;
                const __m512 v = S == 1 ? _mm512_loadu_ps(src)
                                        : _mm512_permutex2var_ps(_mm512_loadu_ps(src), even, _mm512_loadu_ps(src + 16));
                acc = MX ? _mm512_max_ps(acc, v) : _mm512_add_ps(acc, v);
              }
            }
            if constexpr (!MX) acc = _mm512_div_ps(acc, vdiv);
            _mm512_mask_storeu_ps(yr + ox, mk, acc);
          }
        }
#endif
        for (; ox < wo; ++ox) {
          float acc = init;
          for (int64_t ky = 0; ky < kh; ++ky) {
            const float* src = r0 + ky * dh * Wp + ox * sw;
            for (int64_t kx = 0; kx < kwn; ++kx) acc = MX ? std::max(acc, src[kx * dw]) : acc + src[kx * dw];
          }
          yr[ox] = MX ? acc : acc / pool_div;
        }
      }
    });
  }

#if defined(__AVX512F__)
  // the first min(16, n) lanes (none where n <= 0)
  static __mmask16 first_lanes(int64_t n) { return (__mmask16)((1u << std::clamp<int64_t>(n, 0, 16)) - 1); }
#endif

  // Note [Native softmax]
  // ~~~~~~~~~~~~~~~~~~~~~
  // Softmax over the trailing axes, as fission writes it (REDUCE_MAX, BROADCAST, SUB,
  // EXP, REDUCE_SUM, BROADCAST, DIV), a row at a time while the row is in L1: its max,
  // then exp(x - max) stored and summed, then the row times 1 / sum; or the numerator
  // alone, where a rewrite divides after the matmul that reads it (sm_norm 0). TVM's kernels
  // for it came as two (the max and the shift; the exp, the sum and the division) at
  // 97 and 70 us on deit_tiny's 3 x 197 x 197 scores in place, two threads: 2 ms of
  // its 16. Tasks are blocks of rows.
  int64_t sm_rows = 0, sm_len = 0, sm_norm = 1;  // sm_norm 0: exp(x - max) alone

  int softmax(void* const* ptrs) const {
    const float* X = static_cast<const float*>(ptrs[a]);
    float* Y = static_cast<float*>(ptrs[nin]);
    const int64_t rows = sm_rows, L = sm_len;
    const int T = rows * L < 16384 ? 1 : threads();
    const int64_t tasks = std::min<int64_t>(rows, 4 * T);
    parallel_for(tasks, T, [&](int64_t t) {
      for (int64_t r = rows * t / tasks; r < rows * (t + 1) / tasks; ++r) {
        const float* x = X + r * L;
        float* y = Y + r * L;
#if defined(__AVX512F__)
        __m512 mv = _mm512_set1_ps(-INFINITY);
        for (int64_t i = 0; i < L; i += 16) {
          const __mmask16 m = first_lanes(L - i);
          mv = _mm512_mask_max_ps(mv, m, mv, _mm512_maskz_loadu_ps(m, x + i));
        }
        const __m512 mx = _mm512_set1_ps(_mm512_reduce_max_ps(mv));
        __m512 sv = _mm512_setzero_ps();
        for (int64_t i = 0; i < L; i += 16) {
          const __mmask16 m = first_lanes(L - i);
          const __m512 e = korch_gemm::exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), mx));
          sv = _mm512_mask_add_ps(sv, m, sv, e);
          _mm512_mask_storeu_ps(y + i, m, e);
        }
        if (!sm_norm) continue;
        const __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(sv));
        for (int64_t i = 0; i < L; i += 16) {
          const __mmask16 m = first_lanes(L - i);
          _mm512_mask_storeu_ps(y + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, y + i), inv));
        }
#else
        float mx = -INFINITY, sum = 0.0f;
        for (int64_t i = 0; i < L; ++i) mx = std::max(mx, x[i]);
        for (int64_t i = 0; i < L; ++i) sum += (y[i] = std::exp(x[i] - mx));
        if (!sm_norm) continue;
        const float inv = 1.0f / sum;
        for (int64_t i = 0; i < L; ++i) y[i] *= inv;
#endif
      }
    });
    return 0;
  }

  // Note [Native LayerNorm]
  // ~~~~~~~~~~~~~~~~~~~~~~~
  // LayerNorm over the last axis as fission writes it (norm.py): a row's mean, then the
  // mean of its squared deviations (two passes, as the reference computes them), then
  // (x - mean) / sqrt(var + eps), times gamma and plus beta where the kernel has them,
  // a row at a time while it is in L1. TVM's kernels for it ran 15.8 us in place on
  // deit_tiny's 197 x 192 rows (two threads), a reduction loop nest per statistic.
  // Tasks are blocks of rows.
  int64_t ln_rows = 0, ln_len = 0, ln_gamma = -1, ln_beta = -1;
  float ln_eps = 0.0f;

  int layernorm(void* const* ptrs) const {
    const float* X = static_cast<const float*>(ptrs[a]);
    const float* G = ln_gamma >= 0 ? static_cast<const float*>(ptrs[ln_gamma]) : nullptr;
    const float* B = ln_beta >= 0 ? static_cast<const float*>(ptrs[ln_beta]) : nullptr;
    float* Y = static_cast<float*>(ptrs[nin]);
    const int64_t rows = ln_rows, L = ln_len;
    const int T = rows * L < 16384 ? 1 : threads();
    const int64_t tasks = std::min<int64_t>(rows, 4 * T);
    const float inv_n = 1.0f / (float)L;
    parallel_for(tasks, T, [&](int64_t t) {
      for (int64_t r = rows * t / tasks; r < rows * (t + 1) / tasks; ++r) {
        const float* x = X + r * L;
        float* y = Y + r * L;
#if defined(__AVX512F__)
        __m512 sv = _mm512_setzero_ps();
        for (int64_t i = 0; i < L; i += 16) sv = _mm512_add_ps(sv, _mm512_maskz_loadu_ps(first_lanes(L - i), x + i));
        const __m512 mv = _mm512_set1_ps(_mm512_reduce_add_ps(sv) * inv_n);
        __m512 qv = _mm512_setzero_ps();
        for (int64_t i = 0; i < L; i += 16) {
          const __mmask16 m = first_lanes(L - i);
          const __m512 dv = _mm512_maskz_sub_ps(m, _mm512_maskz_loadu_ps(m, x + i), mv);
          qv = _mm512_fmadd_ps(dv, dv, qv);
        }
        const __m512 rv = _mm512_set1_ps(1.0f / std::sqrt(_mm512_reduce_add_ps(qv) * inv_n + ln_eps));
        for (int64_t i = 0; i < L; i += 16) {
          const __mmask16 m = first_lanes(L - i);
          __m512 v = _mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), mv), rv);
          if (G) v = _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, G + i));
          if (B) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, B + i));
          _mm512_mask_storeu_ps(y + i, m, v);
        }
#else
        float sum = 0.0f, sq = 0.0f;
        for (int64_t i = 0; i < L; ++i) sum += x[i];
        const float mean = sum * inv_n;
        for (int64_t i = 0; i < L; ++i) sq += (x[i] - mean) * (x[i] - mean);
        const float rs = 1.0f / std::sqrt(sq * inv_n + ln_eps);
        for (int64_t i = 0; i < L; ++i) {
          float v = (x[i] - mean) * rs;
          if (G) v *= G[i];
          if (B) v += B[i];
          y[i] = v;
        }
#endif
      }
    });
    return 0;
  }

  // Note [Native transpose]
  // ~~~~~~~~~~~~~~~~~~~~~~~
  // A permutation that is, once adjacent axes that stay adjacent are merged, a batch of
  // matrix transposes of rows of C floats: Y[b, n, m, c] = X[b, m, n, c]. A task is a
  // block of TP_ROWS x TP_COLS (16 KB each way: it stays in L1); where C is one, its
  // 16 x 16 sub-blocks are transposed in registers (unpack, shuffle, two lane shuffles)
  // column block by column block, so that each row of Y is written a run of whole lines
  // at a time. TVM's kernels for segformer_b1's [16384, 128] -> [128, 16384] took
  // 1.7-2.0 ms in place on two threads (8 MB each way); these blocks, alone, 0.4-0.7 ms
  // (strips of 16 rows over 256 columns, and 64 x 64 blocks, were the same within this
  // VM's noise).
  int64_t tp_b = 0, tp_m = 0, tp_n = 0, tp_c = 1;
  static constexpr int64_t TP_ROWS = 32, TP_COLS = 128;

#if defined(__AVX512F__)
  // r[i] = row i of a 16 x 16 block; afterwards r[j] = its column j
  static KORCH_INLINE void transpose16(__m512 r[16]) {
    __m512 t[16];
    for (int i = 0; i < 8; ++i) {
      t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
      t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    // u[4i + j], lane L: column 4L + j of rows 4i .. 4i + 3
    for (int i = 0; i < 4; ++i) {
      r[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
      r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
      r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
      r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int h = 0; h < 2; ++h)
      for (int j = 0; j < 4; ++j) {
        t[8 * h + j] = _mm512_shuffle_f32x4(r[8 * h + j], r[8 * h + 4 + j], 0x88);
        t[8 * h + 4 + j] = _mm512_shuffle_f32x4(r[8 * h + j], r[8 * h + 4 + j], 0xdd);
      }
    for (int j = 0; j < 8; ++j) {
      r[j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0x88);
      r[8 + j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0xdd);
    }
  }
#endif

  int transpose(void* const* ptrs) const {
    const float* X = static_cast<const float*>(ptrs[a]);
    float* Y = static_cast<float*>(ptrs[nin]);
    const int64_t B = tp_b, M = tp_m, N = tp_n, C = tp_c;
    const int T = B * M * N * C < 32768 ? 1 : threads();
    const int64_t RB = TP_ROWS, CB = TP_COLS;
    const int64_t strips = (M + RB - 1) / RB, chunks = (N + CB - 1) / CB;
    parallel_for(B * strips * chunks, T, [&](int64_t t) {
      const int64_t b = t / (strips * chunks), r0 = (t / chunks) % strips * RB, n0 = t % chunks * CB;
      const int64_t r1 = std::min(M, r0 + RB), n1 = std::min(N, n0 + CB);
      const float* x = X + b * M * N * C;
      float* y = Y + b * N * M * C;
      if (C > 1) {
        for (int64_t n = n0; n < n1; ++n)
          for (int64_t i = r0; i < r1; ++i) std::memcpy(y + (n * M + i) * C, x + (i * N + n) * C, sizeof(float) * C);
        return;
      }
#if defined(__AVX512F__)
      for (int64_t c0 = n0; c0 < n1; c0 += 16) {
        const int64_t tn = std::min<int64_t>(16, n1 - c0);
        const __mmask16 cm = first_lanes(tn);
        for (int64_t m0 = r0; m0 < r1; m0 += 16) {
          const int64_t tm = std::min<int64_t>(16, r1 - m0);
          const __mmask16 rm = first_lanes(tm);
          const float* xs = x + m0 * N + c0;
          __m512 r[16];
          for (int i = 0; i < 16; ++i) r[i] = i < tm ? _mm512_maskz_loadu_ps(cm, xs + i * N) : _mm512_setzero_ps();
          transpose16(r);
          for (int64_t j = 0; j < tn; ++j) _mm512_mask_storeu_ps(y + (c0 + j) * M + m0, rm, r[j]);
        }
      }
#else
      for (int64_t n = n0; n < n1; ++n)
        for (int64_t i = r0; i < r1; ++i) y[n * M + i] = x[i * N + n];
#endif
    });
    return 0;
  }

  // Note [Native strided copies]
  // ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
  // A kernel of layout primitives (RESHAPE, TRANSPOSE, SLICE, BROADCAST) over one input,
  // each output maybe through elementwise steps with a scalar operand: every output is
  // a strided view of the input (an offset and a stride per output axis, found in
  // Python: copy.py), copied a row at a time, the steps applied to the row while it is
  // in cache. deit_tiny's per-layer split of q, k^T and v out of the QKV product, with
  // q's and k's scales, ran 46 us as a TVM kernel. The axes come merged where the
  // input's strides allow (coalesced at create); a task is a block of rows of one
  // output.
  struct CopyOut {
    std::vector<int64_t> shape, strides;  // merged; the last axis is the row
    int64_t offset = 0, size = 0;
    std::vector<Step> steps;
  };
  std::vector<CopyOut> copies;
  std::vector<int64_t> copy_task;  // per task: output j, first row, end row (flattened triples)
  int64_t copy_total = 0;          // the outputs' elements together

  void plan_copies() {
    for (CopyOut& c : copies) {
      std::vector<int64_t> sh, st;
      for (size_t d = 0; d < c.shape.size(); ++d) {
        if (c.shape[d] == 1) continue;
        if (!sh.empty() && st.back() == c.strides[d] * c.shape[d]) {
          sh.back() *= c.shape[d];
          st.back() = c.strides[d];
        } else {
          sh.push_back(c.shape[d]);
          st.push_back(c.strides[d]);
        }
      }
      if (sh.empty()) sh.push_back(1), st.push_back(0);
      c.shape = sh, c.strides = st;
    }
    for (size_t j = 0; j < copies.size(); ++j) {
      const CopyOut& c = copies[j];
      copy_total += c.size;
      if (c.size == 0) continue;
      const int64_t D = (int64_t)c.shape.size(), L = c.shape.back(), rows = c.size / L;
      int64_t per = std::max<int64_t>(1, 4096 / L);
      if (D >= 2 && c.strides[D - 1] > 1 && c.strides[D - 2] == 1) per = std::max<int64_t>(16, per / 16 * 16);  // Note [Transposed copies]
      for (int64_t r = 0; r < rows; r += per) copy_task.insert(copy_task.end(), {(int64_t)j, r, std::min(rows, r + per)});
    }
  }

  int copy(void* const* ptrs) const {
    const float* X = static_cast<const float*>(ptrs[a]);
    const int T = copy_total < 32768 ? 1 : threads();
    parallel_for((int64_t)copy_task.size() / 3, T, [&](int64_t t) {
      const CopyOut& c = copies[(size_t)copy_task[3 * t]];
      float* Y = static_cast<float*>(ptrs[nin + copy_task[3 * t]]);
      const int64_t D = (int64_t)c.shape.size(), L = c.shape[D - 1], s = c.strides[D - 1];
      auto row_input = [&](int64_t r) {  // where row r starts in the input
        int64_t off = c.offset;
        for (int64_t d = D - 2; d >= 0; --d) {
          off += (r % c.shape[d]) * c.strides[d];
          r /= c.shape[d];
        }
        return X + off;
      };
      auto apply_steps = [&](float* y) {
        for (const Step& st : c.steps) {
          if (st.kind == 0) unary(st.op, y, L);
          else binary(st.op, y, L, &st.scalar, 0, st.left != 0);
        }
      };
#if defined(__AVX512F__)
      // Note [Transposed copies]: a row strided in the input, its neighbour row the next
      // float (k^T out of a QKV product): sixteen rows at a time, their columns loaded
      // sixteen rows wide and transposed in registers, not gathered element by element
      // (deit_tiny's [3, 64, 197] k^T out of [197, 576]: 17.8 us in place, gathered)
      if (s != 1 && s != 0 && D >= 2 && c.strides[D - 2] == 1) {
        const int64_t R = c.shape[D - 2], r1 = copy_task[3 * t + 2];
        for (int64_t r = copy_task[3 * t + 1]; r < r1;) {
          const int64_t g = std::min({r1 - r, (int64_t)16, R - r % R});
          const float* x = row_input(r);
          float* y = Y + r * L;
          const __mmask16 rm = first_lanes(g);
          for (int64_t t0 = 0; t0 < L; t0 += 16) {
            const int64_t tn = std::min<int64_t>(16, L - t0);
            __m512 v[16];
            for (int j = 0; j < 16; ++j) v[j] = j < tn ? _mm512_maskz_loadu_ps(rm, x + (t0 + j) * s) : _mm512_setzero_ps();
            transpose16(v);
            const __mmask16 cm = first_lanes(tn);
            for (int64_t i = 0; i < g; ++i) _mm512_mask_storeu_ps(y + i * L + t0, cm, v[i]);
          }
          for (int64_t i = 0; i < g; ++i) apply_steps(y + i * L);
          r += g;
        }
        return;
      }
#endif
      for (int64_t r = copy_task[3 * t + 1]; r < copy_task[3 * t + 2]; ++r) {
        const float* x = row_input(r);
        float* y = Y + r * L;
        if (s == 1) {
          std::memcpy(y, x, sizeof(float) * L);
        } else if (s == 0) {
          std::fill(y, y + L, *x);
        } else {
          for (int64_t i = 0; i < L; ++i) y[i] = x[i * s];
        }
        apply_steps(y);
      }
    });
    return 0;
  }

  // Note [Native TopK]
  // ~~~~~~~~~~~~~~~~~~
  // ONNX TopK with sorted = 1, as onnxruntime computes it: the k largest (smallest)
  // values of each line along the axis in order, an equal value's lower index first.
  // An onnxruntime session between two native segments cost its own call, its pool's
  // wake-up and a second segment call (opaque's [1, 64, 128] TopK: 43 us measured alone,
  // 138 us in place); here it is a step of the segment. Each line keeps its best k by
  // insertion (partial_sort with a comparator over indices took 92 us for that TopK),
  // lines split over the pool when there are many.
  int topk(void* const* ptrs) const {
    const float* X = static_cast<const float*>(ptrs[a]);
    float* V = nullptr;
    int64_t* I = nullptr;
    for (int64_t j = 0; j < nout; ++j) {
      if (tk_which[(size_t)j] == 0) V = static_cast<float*>(ptrs[nin + j]);
      else I = static_cast<int64_t*>(ptrs[nin + j]);
    }
    const int64_t lines = tk_outer * tk_inner, L = tk_len, K = tk_k, inner = tk_inner;
    const bool largest = tk_largest != 0;
    const int T = (double)lines * L < 65536.0 ? 1 : threads();
    parallel_for(lines, T, [&](int64_t t) {
      const int64_t o = t / inner, in = t % inner;
      const float* x = X + o * L * inner + in;
      // the best k so far, in order, kept by insertion: an element not better than the
      // k-th is one compare (most of a random line once the buffer fills); equal values
      // keep the lower index first because the line is scanned in index order
      thread_local std::vector<float> bv;
      thread_local std::vector<int64_t> bi;
      bv.resize((size_t)K);
      bi.resize((size_t)K);
      float* __restrict pv = bv.data();  // (a thread_local in a shared library is a call per use)
      int64_t* __restrict pi = bi.data();
      int64_t n = 0;
      for (int64_t i = 0; i < L; ++i) {
        const float u = x[i * inner];
        if (n == K && !(largest ? u > pv[(size_t)(K - 1)] : u < pv[(size_t)(K - 1)])) continue;
        int64_t j = n < K ? n++ : K - 1;
        while (j > 0 && (largest ? u > pv[(size_t)(j - 1)] : u < pv[(size_t)(j - 1)])) {
          pv[(size_t)j] = pv[(size_t)(j - 1)];
          pi[(size_t)j] = pi[(size_t)(j - 1)];
          --j;
        }
        pv[(size_t)j] = u;
        pi[(size_t)j] = i;
      }
      const int64_t base = o * K * inner + in;
      for (int64_t i = 0; i < K; ++i) {
        if (V) V[base + i * inner] = pv[(size_t)i];
        if (I) I[base + i * inner] = pi[(size_t)i];
      }
    });
    return 0;
  }

  // B packed (groups of [K, N] operands, B(k, n) = W[g * gstride + k * bk + n * bn]), once
  const float* pack(const float* W, int64_t groups, int64_t gstride, int64_t K, int64_t N, int64_t bk,
                    int64_t bn) const {
    std::lock_guard<std::mutex> lock(pack_mu);
    if (packed_from != W) {
      const int64_t per = korch_gemm::packed_size(K, N);
      packed.assign((size_t)(per * groups + 16), 0.0f);
      float* base = aligned_panels();
      for (int64_t g = 0; g < groups; ++g) korch_gemm::pack_b(W + g * gstride, K, N, bk, bn, base + g * per);
      packed_from = W;
    }
    return aligned_panels();
  }

  // Note [Aligned panels]
  // ~~~~~~~~~~~~~~~~~~~~~
  // A panel row is NR = 16 floats, one 64-byte cache line. The vector's storage is
  // 16-byte aligned, so a row straddled two lines and every other load of the micro
  // kernel was a split load; the panels start at the first 64-byte boundary of it.
  float* aligned_panels() const { return align64(packed.data()); }

  bool packed_matmul() const {
    if (!korch_gemm::available || !b_const || M < korch_gemm::MR) return false;
    for (int64_t o : boff)
      if (o != 0) return false;
    return true;
  }

  int matmul_packed(void* const* ptrs) const {
    const float* A = static_cast<const float*>(ptrs[a]);
    float* C = static_cast<float*>(ptrs[nin + main]);
    const float* Bp = pack(static_cast<const float*>(ptrs[b]), 1, 0, K, N, N, 1);
    const int64_t panels = (N + korch_gemm::NR - 1) / korch_gemm::NR;
    const int T = 2.0 * batch * M * N * K < SERIAL_FLOPS && 4.0 * K * N < SERIAL_WEIGHT_BYTES ? 1 : threads();
    const int64_t parts = batch_parts(batch, T);  // Note [Balanced batches]
    const bool rows = M >= 4 * korch_gemm::MR * parts || panels < parts;
    const int64_t tasks = batch * parts;
    // Note [Register post-ops]: its bias zero padded to whole pairs of panels
    std::vector<float> bias_buf;
    korch_gemm::Post post = post_for(ptrs, bias_buf);
    std::vector<float> bias_pad;
    if (post_steps && post.bias) {
      bias_pad.assign((size_t)((panels + 1) * korch_gemm::NR), 0.0f);
      std::memcpy(bias_pad.data(), post.bias, sizeof(float) * (size_t)N);
      post.bias = bias_pad.data();
    }
    const korch_gemm::Post* pp = post_steps ? &post : nullptr;
    parallel_for(tasks, T, [&](int64_t t) {
      const int64_t bi = t / parts, p = t % parts;
      const float* Ab = A + aoff[bi];
      float* Cb = C + bi * M * N;
      if (rows) {
        const int64_t m0 = M * p / parts, m1 = M * (p + 1) / parts;
        if (m1 <= m0) return;
        korch_gemm::gemm(N, K, Ab, K, 1, Bp, Cb, N, 1, m0, m1, 0, panels, pp);
        epilogue(C, ptrs, bi * M * N + m0 * N, bi * M * N + m1 * N, post_steps);
      } else {
        const int64_t q0 = panels * p / parts, q1 = panels * (p + 1) / parts;
        if (q1 <= q0) return;
        korch_gemm::gemm(N, K, Ab, K, 1, Bp, Cb, N, 1, 0, M, q0, q1, pp);
        const int64_t n0 = q0 * korch_gemm::NR, n1 = std::min(N, q1 * korch_gemm::NR);
        for (int64_t r = 0; r < M; ++r)
          epilogue(C, ptrs, bi * M * N + r * N + n0, bi * M * N + r * N + n1, post_steps);
      }
    });
    return 0;
  }

  int matmul(void* const* ptrs) const {
    if (packed_matmul()) return matmul_packed(ptrs);
    const float* A = static_cast<const float*>(ptrs[a]);
    const float* B = static_cast<const float*>(ptrs[b]);
    float* C = static_cast<float*>(ptrs[nin + main]);
    const double flops = 2.0 * batch * M * N * K;
    const int T = flops < SERIAL_FLOPS ? 1 : threads();
    // tasks: (batch, part); a part is a block of rows, or of columns when M is small
    const int64_t parts = batch_parts(batch, T);  // Note [Balanced batches]
    const bool rows = M >= 4 * parts || N < 16 * parts;
    const int64_t tasks = batch * parts;
    parallel_for(tasks, T, [&](int64_t t) {
      const int64_t bi = t / parts, p = t % parts;
      const float* Ab = A + aoff[bi];
      const float* Bb = B + boff[bi];
      float* Cb = C + bi * M * N;
      if (rows) {
        const int64_t m0 = M * p / parts, m1 = M * (p + 1) / parts;
        if (m1 > m0 && M == 1) {
          scipy_cblas_sgemv(CblasRowMajor, CblasTrans, (int)K, (int)N, 1.0f, Bb, (int)N, Ab, 1, 0.0f, Cb, 1);
          epilogue(C, ptrs, bi * N, bi * N + N);
        } else if (m1 > m0) {
          scipy_cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)(m1 - m0), (int)N, (int)K, 1.0f,
                            Ab + m0 * K, (int)K, Bb, (int)N, 0.0f, Cb + m0 * N, (int)N);
          epilogue(C, ptrs, bi * M * N + m0 * N, bi * M * N + m1 * N);
        }
      } else {
        const int64_t n0 = N * p / parts, n1 = N * (p + 1) / parts;
        if (n1 > n0 && M == 1) {  // a row vector times B: GEMV (OpenBLAS's GEMM is slow at M = 1)
          scipy_cblas_sgemv(CblasRowMajor, CblasTrans, (int)K, (int)(n1 - n0), 1.0f, Bb + n0, (int)N, Ab, 1, 0.0f,
                            Cb + n0, 1);
          epilogue(C, ptrs, bi * N + n0, bi * N + n1);
        } else if (n1 > n0) {
          scipy_cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)M, (int)(n1 - n0), (int)K, 1.0f, Ab,
                            (int)K, Bb + n0, (int)N, 0.0f, Cb + n0, (int)N);
          for (int64_t r = 0; r < M; ++r) epilogue(C, ptrs, bi * M * N + r * N + n0, bi * M * N + r * N + n1);
        }
      }
    });
    return 0;
  }


#if defined(__AVX2__) && defined(__FMA__)
  // Note [Channel-blocked depthwise]
  // ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
  // The previous kernel vectorised a depthwise conv along an NCHW row, over a zero-padded
  // copy of the channel (split into phase planes at stride 2). It wasted lanes when the
  // output row was short (7 of 8 lanes at 7x7) and paid the split, so MobileNetV3's
  // depthwise convs ran at 0.25-0.6x onnxruntime, whose kernel runs in NCHWc with 8
  // channels a vector. This path takes that layout inside the kernel only. 8 channels
  // of a band of input rows are transposed (8 x 8 AVX2 transposes) into a [row][col][8]
  // plane with a zeroed border. Every output pixel is kh * kw FMAs, each with one
  // aligned load, with eight pixels in flight. The [pixel][8] result is transposed back
  // into the 8 NCHW planes, so the tensors between kernels stay NCHW. Tasks are (image,
  // 8 channels, band of output rows). benchmarks/native_linear.py --only dwconv: every
  // MobileNetV3 case 0.92-1.41x onnxruntime, and a 56x56 stride-1 3x3 1.24x where the
  // row kernel gave 0.82x (RESULTS). Over 64 taps, the scalar row code below.
  static constexpr int64_t DW_BAND_BYTES = 48 * 1024;
  static constexpr int64_t PADDED_TAPS = 64;
  static constexpr int64_t DW_PIXELS = 8;  // output pixels in flight  // a task's padded input band stays in L1/L2

  static inline void transpose8(__m256& r0, __m256& r1, __m256& r2, __m256& r3, __m256& r4, __m256& r5, __m256& r6,
                                __m256& r7) {
    const __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
    const __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
    const __m256 t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5);
    const __m256 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
    const __m256 u0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0));
    const __m256 u1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
    const __m256 u2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0));
    const __m256 u3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
    const __m256 u4 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(1, 0, 1, 0));
    const __m256 u5 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(3, 2, 3, 2));
    const __m256 u6 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(1, 0, 1, 0));
    const __m256 u7 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(3, 2, 3, 2));
    r0 = _mm256_permute2f128_ps(u0, u4, 0x20), r1 = _mm256_permute2f128_ps(u1, u5, 0x20);
    r2 = _mm256_permute2f128_ps(u2, u6, 0x20), r3 = _mm256_permute2f128_ps(u3, u7, 0x20);
    r4 = _mm256_permute2f128_ps(u0, u4, 0x31), r5 = _mm256_permute2f128_ps(u1, u5, 0x31);
    r6 = _mm256_permute2f128_ps(u2, u6, 0x31), r7 = _mm256_permute2f128_ps(u3, u7, 0x31);
  }

  // a channel-blocked plane ([bh rows][pw cols][lanes]) zeroed where the input does
  // not land: rows outside [lo, hi), and in those rows the columns outside [pl, pl + ncopy)
  void zero_plane_border(float* P, int64_t lanes, int64_t bh, int64_t pw, int64_t lo, int64_t hi,
                         int64_t ncopy) const {
    std::memset(P, 0, sizeof(float) * (size_t)(lo * pw * lanes));
    std::memset(P + hi * pw * lanes, 0, sizeof(float) * (size_t)((bh - hi) * pw * lanes));
    for (int64_t r = lo; r < hi; ++r) {
      std::memset(P + r * pw * lanes, 0, sizeof(float) * (size_t)(std::min(pl, pw) * lanes));
      if (pl + ncopy < pw)
        std::memset(P + (r * pw + pl + ncopy) * lanes, 0, sizeof(float) * (size_t)((pw - pl - ncopy) * lanes));
    }
  }

  // output rows per band: the padded input rows of a band within DW_BAND_BYTES
  int64_t dw_band_rows() const {
    const int64_t pw = (wo - 1) * sw + (kw - 1) * dw + 1;
    const int64_t rows_in = std::max<int64_t>((kh - 1) * dh + 1, DW_BAND_BYTES / (pw * 32));
    return std::min(ho, std::max<int64_t>(1, (rows_in - (kh - 1) * dh - 1) / sh + 1));
  }

  // channels [c0, c0 + 8) of image ni (zero weights past co), output rows [oy0, oy1)
  // the weights as [co / 8][kh * kw][8] (zero past co), packed once (b_const) or per call
  const float* pack_depthwise(const float* W) const {
    std::lock_guard<std::mutex> lock(pack_mu);
    if (packed_from != W || !b_const) {
      const int64_t taps = kh * kw, cb = (co + 7) / 8;
      packed.assign((size_t)(cb * taps * 8 + 16), 0.0f);
      float* base = aligned_panels();
      for (int64_t ch = 0; ch < co; ++ch)
        for (int64_t t = 0; t < taps; ++t) base[((ch / 8) * taps + t) * 8 + ch % 8] = W[ch * taps + t];
      packed_from = W;
    }
    return aligned_panels();
  }

  void depthwise_blocked(const float* X, const float* Wb, float* Y, int64_t ni, int64_t c0, int64_t oy0,
                         int64_t oy1, const korch_gemm::Post* post) const {
    const int64_t nc = std::min<int64_t>(8, co - c0), taps = kh * kw;
    const int64_t pw = (wo - 1) * sw + (kw - 1) * dw + 1, bh = (oy1 - oy0 - 1) * sh + (kh - 1) * dh + 1;
    const int64_t iy0 = oy0 * sh - pt, nq = (oy1 - oy0) * wo;
    thread_local std::vector<float> Pv, Rv, zeros;
    if (Pv.size() < (size_t)(bh * pw * 8 + 8)) Pv.resize((size_t)(bh * pw * 8 + 8));
    if (Rv.size() < (size_t)((nq + DW_PIXELS) * 8 + 8)) Rv.resize((size_t)((nq + DW_PIXELS) * 8 + 8));
    auto align32 = [](float* p) {
      return reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(p) + 31) & ~uintptr_t(31));
    };
    float* P = align32(Pv.data());
    float* R = align32(Rv.data());
    // the band's input rows [r0, r1) land at plane rows r - iy0; only the border is zeroed
    const int64_t r0 = std::min(h, std::max<int64_t>(0, iy0)), r1 = std::max(r0, std::min(h, iy0 + bh));
    const int64_t ncopy = std::max<int64_t>(0, std::min(w, pw - pl));  // input columns that land in the plane
    const int64_t lo = std::max<int64_t>(0, r0 - iy0), hi = std::max(lo, r1 - iy0);
    zero_plane_border(P, 8, bh, pw, lo, hi, ncopy);
    const float* src[8];
    auto transpose_into = [&](float* dst, int64_t len) {  // src[j][0, len) -> dst[len][8]
      int64_t q = 0;
      for (; q + 8 <= len; q += 8) {
        __m256 v0 = _mm256_loadu_ps(src[0] + q), v1 = _mm256_loadu_ps(src[1] + q), v2 = _mm256_loadu_ps(src[2] + q),
               v3 = _mm256_loadu_ps(src[3] + q), v4 = _mm256_loadu_ps(src[4] + q), v5 = _mm256_loadu_ps(src[5] + q),
               v6 = _mm256_loadu_ps(src[6] + q), v7 = _mm256_loadu_ps(src[7] + q);
        transpose8(v0, v1, v2, v3, v4, v5, v6, v7);
        float* d = dst + q * 8;
        _mm256_store_ps(d, v0), _mm256_store_ps(d + 8, v1), _mm256_store_ps(d + 16, v2), _mm256_store_ps(d + 24, v3);
        _mm256_store_ps(d + 32, v4), _mm256_store_ps(d + 40, v5), _mm256_store_ps(d + 48, v6);
        _mm256_store_ps(d + 56, v7);
      }
      for (; q < len; ++q)
        for (int64_t j = 0; j < 8; ++j) dst[q * 8 + j] = src[j][q];
    };
    if (r1 > r0 && ncopy > 0) {
      const int64_t np = (r1 - r0) * w;
      if (nc < 8 && zeros.size() < (size_t)(np + 8)) zeros.assign((size_t)(np + 8), 0.0f);
      if (ncopy >= 16) {  // rows long enough: transposed straight into the plane
        for (int64_t iy = r0; iy < r1; ++iy) {
          for (int64_t j = 0; j < 8; ++j) src[j] = j < nc ? X + ((ni * c + c0 + j) * h + iy) * w : zeros.data();
          transpose_into(P + ((iy - iy0) * pw + pl) * 8, ncopy);
        }
      } else {
        // short rows (7 or 14 wide would leave most of a row-wise transpose to scalar
        // code): transposed over the 8 planes' flat pixels, then copied row by row
        thread_local std::vector<float> Tv;
        if (Tv.size() < (size_t)(np * 8 + 8)) Tv.resize((size_t)(np * 8 + 8));
        float* Tt = align32(Tv.data());
        for (int64_t j = 0; j < 8; ++j) src[j] = j < nc ? X + ((ni * c + c0 + j) * h + r0) * w : zeros.data();
        transpose_into(Tt, np);
        for (int64_t iy = r0; iy < r1; ++iy)
          std::memcpy(P + ((iy - iy0) * pw + pl) * 8, Tt + (iy - r0) * w * 8, sizeof(float) * (size_t)(ncopy * 8));
      }
    }
    const float* kb = Wb + (c0 / 8) * taps * 8;  // this block's taps, 8 channels each
    int64_t toff[PADDED_TAPS];
    for (int64_t t = 0; t < taps; ++t) toff[t] = ((t / kw) * dh * pw + (t % kw) * dw) * 8;
    // eight output pixels at a time over the band's flat pixels: eight FMA chains in
    // flight (four left the FMA's latency exposed: 25 taps x 5 cycles per four pixels),
    // and a 7-wide row does not end on one chain; the last pixel repeats
    int64_t oy = 0, ox = 0;
    for (int64_t q0 = 0; q0 < nq; q0 += DW_PIXELS) {
      const float* base[DW_PIXELS];
      for (int64_t j = 0; j < DW_PIXELS; ++j) {
        base[j] = P + (oy * sh * pw + ox * sw) * 8;
        if (q0 + j + 1 < nq && ++ox == wo) ox = 0, ++oy;
      }
      __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
      for (int64_t t = 0; t < taps; ++t) {
        const __m256 kk = _mm256_load_ps(kb + t * 8);
        const int64_t off = toff[t];
        a0 = _mm256_fmadd_ps(kk, _mm256_load_ps(base[0] + off), a0);
        a1 = _mm256_fmadd_ps(kk, _mm256_load_ps(base[1] + off), a1);
        a2 = _mm256_fmadd_ps(kk, _mm256_load_ps(base[2] + off), a2);
        a3 = _mm256_fmadd_ps(kk, _mm256_load_ps(base[3] + off), a3);
        a4 = _mm256_fmadd_ps(kk, _mm256_load_ps(base[4] + off), a4);
        a5 = _mm256_fmadd_ps(kk, _mm256_load_ps(base[5] + off), a5);
        a6 = _mm256_fmadd_ps(kk, _mm256_load_ps(base[6] + off), a6);
        a7 = _mm256_fmadd_ps(kk, _mm256_load_ps(base[7] + off), a7);
      }
      if (post) {  // Note [Register post-ops]: a vector is eight channels
        if (post->bias) {
          const __m256 b = _mm256_load_ps(post->bias);
          a0 = _mm256_add_ps(a0, b), a1 = _mm256_add_ps(a1, b), a2 = _mm256_add_ps(a2, b), a3 = _mm256_add_ps(a3, b);
          a4 = _mm256_add_ps(a4, b), a5 = _mm256_add_ps(a5, b), a6 = _mm256_add_ps(a6, b), a7 = _mm256_add_ps(a7, b);
        }
        a0 = korch_gemm::post_act8(*post, a0), a1 = korch_gemm::post_act8(*post, a1);
        a2 = korch_gemm::post_act8(*post, a2), a3 = korch_gemm::post_act8(*post, a3);
        a4 = korch_gemm::post_act8(*post, a4), a5 = korch_gemm::post_act8(*post, a5);
        a6 = korch_gemm::post_act8(*post, a6), a7 = korch_gemm::post_act8(*post, a7);
      }
      float* out = R + q0 * 8;  // R has room for the repeats past nq
      _mm256_store_ps(out, a0), _mm256_store_ps(out + 8, a1), _mm256_store_ps(out + 16, a2);
      _mm256_store_ps(out + 24, a3), _mm256_store_ps(out + 32, a4), _mm256_store_ps(out + 40, a5);
      _mm256_store_ps(out + 48, a6), _mm256_store_ps(out + 56, a7);
    }
    float* dst[8];
    for (int64_t j = 0; j < 8; ++j) dst[j] = Y + (ni * co + c0 + std::min(j, nc - 1)) * ho * wo + oy0 * wo;
    int64_t q = 0;
    for (; q + 8 <= nq; q += 8) {
      const float* s8 = R + q * 8;
      __m256 v0 = _mm256_load_ps(s8), v1 = _mm256_load_ps(s8 + 8), v2 = _mm256_load_ps(s8 + 16),
             v3 = _mm256_load_ps(s8 + 24), v4 = _mm256_load_ps(s8 + 32), v5 = _mm256_load_ps(s8 + 40),
             v6 = _mm256_load_ps(s8 + 48), v7 = _mm256_load_ps(s8 + 56);
      transpose8(v0, v1, v2, v3, v4, v5, v6, v7);
      const __m256 vs[8] = {v0, v1, v2, v3, v4, v5, v6, v7};
      for (int64_t j = nc - 1; j >= 0; --j) _mm256_storeu_ps(dst[j] + q, vs[j]);
    }
    for (; q < nq; ++q)
      for (int64_t j = 0; j < nc; ++j) dst[j][q] = R[q * 8 + j];
  }
#endif
#if defined(__AVX512F__)
  // Note [Channel-blocked depthwise] on sixteen channels (AVX-512): the plane is
  // [row][col][16], the transposes 16 x 16 in zmm (korch_gemm::transpose16), the ragged
  // ends of rows through masked loads and stores, twelve pixels in flight, a row's
  // pixels addressed from one pointer. On an Intel Xeon core (two 512-bit FMA pipes) it
  // took benchmarks/native_linear.py's stride-1 cases from 141-145 to 129-131 us (96
  // channels, 56 x 56), 46 to 37 (5x5, 576 channels, 7 x 7), 40-41 to 34-37 (88
  // channels, 28 x 28) on two threads. Its stride-2 cases were first 5-12% slower than
  // eight channels and kept eight; once the sixteen-lane exp took one vscalefps, SiLU
  // after a stride-2 conv ran 10% faster on sixteen (96 channels, 112 x 112: 323-325 ->
  // 287-295 us; 5x5 288 channels, 14 x 14: 28 -> 25 us; without an activation the
  // same), so every stride takes sixteen. efficientnet_b0's depthwise convs with SiLU
  // still ran at 0.7x of onnxruntime's in place, which keeps NCHWc between convs and
  // transposes nothing.
  static constexpr int64_t DW16_PIXELS = 12;

  const float* pack_depthwise16(const float* W) const {
    std::lock_guard<std::mutex> lock(pack_mu);
    if (packed_from != W || !b_const) {
      const int64_t taps = kh * kw, cb = (co + 15) / 16;
      packed.assign((size_t)(cb * taps * 16 + 16), 0.0f);
      float* base = aligned_panels();
      for (int64_t ch = 0; ch < co; ++ch)
        for (int64_t t = 0; t < taps; ++t) base[((ch / 16) * taps + t) * 16 + ch % 16] = W[ch * taps + t];
      packed_from = W;
    }
    return aligned_panels();
  }

  // channels [c0, c0 + 16) of image ni, output rows [oy0, oy1)
  void depthwise_blocked16(const float* X, const float* Wb, float* Y, int64_t ni, int64_t c0, int64_t oy0,
                           int64_t oy1, const korch_gemm::Post* post) const {
    constexpr int64_t L = 16;
    const int64_t nc = std::min<int64_t>(L, co - c0), taps = kh * kw;
    const int64_t pw = (wo - 1) * sw + (kw - 1) * dw + 1, bh = (oy1 - oy0 - 1) * sh + (kh - 1) * dh + 1;
    const int64_t iy0 = oy0 * sh - pt, nq = (oy1 - oy0) * wo;
    thread_local std::vector<float> Pv, Rv, Tv, zeros;
    if (Pv.size() < (size_t)(bh * pw * L + L)) Pv.resize((size_t)(bh * pw * L + L));
    if (Rv.size() < (size_t)((nq + DW16_PIXELS) * L + L)) Rv.resize((size_t)((nq + DW16_PIXELS) * L + L));
    float* P = align64(Pv.data());
    float* R = align64(Rv.data());
    const int64_t r0 = std::min(h, std::max<int64_t>(0, iy0)), r1 = std::max(r0, std::min(h, iy0 + bh));
    const int64_t ncopy = std::max<int64_t>(0, std::min(w, pw - pl));
    const int64_t lo = std::max<int64_t>(0, r0 - iy0), hi = std::max(lo, r1 - iy0);
    zero_plane_border(P, L, bh, pw, lo, hi, ncopy);
    const float* src[L];
    auto transpose_into = [&](float* dst, int64_t len) {  // src[j][0, len) -> dst[len][16]
      for (int64_t q = 0; q < len; q += L) {
        const int64_t m = std::min<int64_t>(L, len - q);
        const __mmask16 mk = (__mmask16)((1u << m) - 1);
        __m512 v[L];
        for (int64_t j = 0; j < L; ++j) v[j] = _mm512_maskz_loadu_ps(mk, src[j] + q);
        korch_gemm::transpose16(v);
        float* d = dst + q * L;
        for (int64_t j = 0; j < m; ++j) _mm512_store_ps(d + j * L, v[j]);
      }
    };
    if (r1 > r0 && ncopy > 0) {
      const int64_t np = (r1 - r0) * w;
      if (nc < L && zeros.size() < (size_t)(np + L)) zeros.assign((size_t)(np + L), 0.0f);
      if (ncopy >= 32) {  // rows long enough: transposed straight into the plane
        for (int64_t iy = r0; iy < r1; ++iy) {
          for (int64_t j = 0; j < L; ++j) src[j] = j < nc ? X + ((ni * c + c0 + j) * h + iy) * w : zeros.data();
          transpose_into(P + ((iy - iy0) * pw + pl) * L, ncopy);
        }
      } else {  // short rows: over the planes' flat pixels, then row by row
        if (Tv.size() < (size_t)(np * L + 2 * L)) Tv.resize((size_t)(np * L + 2 * L));
        float* Tt = align64(Tv.data());
        for (int64_t j = 0; j < L; ++j) src[j] = j < nc ? X + ((ni * c + c0 + j) * h + r0) * w : zeros.data();
        transpose_into(Tt, np);
        for (int64_t iy = r0; iy < r1; ++iy)
          std::memcpy(P + ((iy - iy0) * pw + pl) * L, Tt + (iy - r0) * w * L, sizeof(float) * (size_t)(ncopy * L));
      }
    }
    const float* kb = Wb + (c0 / L) * taps * L;
    int64_t toff[PADDED_TAPS];
    for (int64_t t = 0; t < taps; ++t) toff[t] = ((t / kw) * dh * pw + (t % kw) * dw) * L;
    __m512 bias = _mm512_setzero_ps();
    if (post && post->bias) bias = _mm512_load_ps(post->bias);
    int64_t oy = 0, ox = 0;
    for (int64_t q0 = 0; q0 < nq; q0 += DW16_PIXELS) {
      __m512 a[DW16_PIXELS];
      for (int64_t j = 0; j < DW16_PIXELS; ++j) a[j] = bias;
      // the pixels within one output row at unit or double stride: one pointer, constant
      // offsets (an array of twelve pointers spilled to the stack in the tap loop)
      auto row = [&](auto stride) __attribute__((always_inline)) {
        constexpr int64_t S = decltype(stride)::value;
        const float* b0 = P + (oy * sh * pw + ox * S) * L;
        for (int64_t t = 0; t < taps; ++t) {
          const __m512 kk = _mm512_load_ps(kb + t * L);
          const float* bt = b0 + toff[t];
          for (int64_t j = 0; j < DW16_PIXELS; ++j) a[j] = _mm512_fmadd_ps(kk, _mm512_load_ps(bt + j * S * L), a[j]);
        }
        ox += DW16_PIXELS;
        if (ox == wo) ox = 0, ++oy;
      };
      const bool in_row = ox + DW16_PIXELS <= wo && q0 + DW16_PIXELS <= nq;
      if (in_row && sw == 1) {
        row(std::integral_constant<int64_t, 1>{});
      } else if (in_row && sw == 2) {
        row(std::integral_constant<int64_t, 2>{});
      } else {
        const float* base[DW16_PIXELS];
        for (int64_t j = 0; j < DW16_PIXELS; ++j) {
          base[j] = P + (oy * sh * pw + ox * sw) * L;
          if (q0 + j + 1 < nq && ++ox == wo) ox = 0, ++oy;
        }
        for (int64_t t = 0; t < taps; ++t) {
          const __m512 kk = _mm512_load_ps(kb + t * L);
          const int64_t off = toff[t];
          for (int64_t j = 0; j < DW16_PIXELS; ++j) a[j] = _mm512_fmadd_ps(kk, _mm512_load_ps(base[j] + off), a[j]);
        }
      }
      float* out = R + q0 * L;  // R has room for the repeats past nq
      if (post) {
        for (int64_t j = 0; j < DW16_PIXELS; ++j) _mm512_store_ps(out + j * L, korch_gemm::post_act16(*post, a[j]));
      } else {
        for (int64_t j = 0; j < DW16_PIXELS; ++j) _mm512_store_ps(out + j * L, a[j]);
      }
    }
    float* dst[L];
    for (int64_t j = 0; j < L; ++j) dst[j] = Y + (ni * co + c0 + std::min(j, nc - 1)) * ho * wo + oy0 * wo;
    for (int64_t q = 0; q < nq; q += L) {
      const int64_t m = std::min<int64_t>(L, nq - q);
      const __mmask16 mk = (__mmask16)((1u << m) - 1);
      __m512 v[L];
      for (int64_t j = 0; j < L; ++j) v[j] = _mm512_load_ps(R + (q + std::min(j, m - 1)) * L);
      korch_gemm::transpose16(v);
      for (int64_t j = 0; j < nc; ++j) _mm512_mask_storeu_ps(dst[j] + q, mk, v[j]);
    }
  }
  // Note [Row depthwise]
  // ~~~~~~~~~~~~~~~~~~~~
  // Note [Channel-blocked depthwise] transposes sixteen NCHW planes into a channel-
  // blocked band and back, and an NCHWc layout between kernels is not built. Where an
  // output row is at least ROW_DW_MIN_WO wide, a vector is instead sixteen output
  // columns of one channel straight off its NCHW rows: each tap one masked unaligned
  // load (the masks zero the pad columns, so nothing is copied; rows of the pad read a
  // zero row) and one FMA with the tap's weight broadcast; at stride 2 two loads and
  // one vpermt2ps take the even columns. A tile is RR output rows of NV vectors, all
  // in registers, and each input row is loaded once a tile for every output row it
  // reaches. Tasks are (image, channel, band of output rows). On two threads of an
  // Intel Xeon (benchmarks/native_linear.py --only dwconv, blocked -> rows): 96
  // channels 56 x 56 113.9 -> 82.6 us, 144 channels 56 x 56 with bias and SiLU 226 ->
  // 180, 32 channels 112 x 112 with bias 135 -> 103, stride 2 from 112 x 112 with bias
  // and SiLU 267 -> 227, 88 channels 28 x 28 32.9 -> 26.6. At 14 wide the blocked
  // kernel stays faster (5 x 5, 240 channels: 40.2 against 44.3; 7 wide: 33.7 against
  // 82.5), so it keeps rows under 28.
  static constexpr int64_t ROW_DW_MIN_WO = 28;

  bool row_depthwise() const {
    return ((sw == 1 && sh == 1) || (sw == 2 && sh == 2)) && (kh == 3 || kh == 5 || kh == 7) && dh == 1 && kw <= 8 &&
           wo >= ROW_DW_MIN_WO;
  }

  // per (vector v, tap column kx) at j = v * 8 + kx: the first input column's offset in
  // its row, the lanes that land in [0, w) from it and 16 on; per vector the lanes < wo
  __mmask16 lanes_in(int64_t from) const { return first_lanes(w - from) & (__mmask16)~first_lanes(-from); }

  // the row kernels' tap column kx of the vector of output columns from ox at stride S:
  // where its first input column sits in a row, and the lanes of it (lo) and of the
  // next sixteen (hi, stride 2) inside the row
  struct TapColumn {
    int64_t off = 0;
    __mmask16 lo = 0, hi = 0;
  };
  TapColumn tap_column(int64_t ox, int64_t S, int64_t kx) const {
    const int64_t base = ox * S - pl + kx * dw;
    return {base, lanes_in(base), lanes_in(base + 16)};
  }

  // sixteen output columns' inputs for one tap column: one masked load, or at stride 2
  // two and the even lanes of both
  template <int S>
  static KORCH_INLINE __m512 tap_load(const float* row, const TapColumn& tc) {
    if constexpr (S == 1) {
      return _mm512_maskz_loadu_ps(tc.lo, row + tc.off);
    } else {
      const __m512i evens = even_lanes();
      return _mm512_permutex2var_ps(_mm512_maskz_loadu_ps(tc.lo, row + tc.off), evens,
                                    _mm512_maskz_loadu_ps(tc.hi, row + tc.off + 16));
    }
  }

  // a row of zeros at least w + 64 long: the row kernels' rows of the pad
  const float* zero_row() const {
    thread_local std::vector<float> zeros;
    if (zeros.size() < (size_t)(w + 64)) zeros.assign((size_t)(w + 64), 0.0f);
    return zeros.data();
  }

  struct RowMasks {
    TapColumn col[64];  // [vector * 8 + kx]
    __mmask16 out[8];
  };

  // RR output rows from oy of the chunk's NV vectors; KH rows of taps at stride SH,
  // all three known in compiling, so which tap row an input row is for each output row
  // is too: a test per (input row, output row) mispredicted and cost the tile a third
  // of its time (88 channels, 28 x 28: 65 against 48 us blocked)
  template <int NV, int S, int KH, int SH, int RR>
  KORCH_INLINE void depthwise_rows_tile(const float* Xc, const float* Wc, float* Yc, int64_t oy, int64_t cx0,
                                        float bias, const korch_gemm::Post* post, const RowMasks& m,
                                        const float* zeros) const {
    constexpr int IN = (RR - 1) * SH + KH;  // input rows the tile reads
    const float* rows[IN];
    const int64_t first = oy * SH - pt;
#pragma GCC unroll 32
    for (int t = 0; t < IN; ++t) rows[t] = first + t >= 0 && first + t < h ? Xc + (first + t) * w : zeros;
    __m512 acc[RR][NV];
#pragma GCC unroll 8
    for (int r = 0; r < RR; ++r)
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_set1_ps(bias);
    // a tap column at a time: its KH weights in registers and its masks in mask
    // registers for every input row (with the tap column innermost, each load's mask
    // came from memory through a general register, an extra uop on the FMAs' port)
    for (int64_t kx = 0; kx < kw; ++kx) {
      __m512 k[KH];
#pragma GCC unroll 8
      for (int ky = 0; ky < KH; ++ky) k[ky] = _mm512_set1_ps(Wc[ky * kw + kx]);
      TapColumn tc[NV];
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) tc[v] = m.col[v * 8 + kx];
#pragma GCC unroll 32
      for (int t = 0; t < IN; ++t) {
        __m512 x[NV];
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) x[v] = tap_load<S>(rows[t], tc[v]);
#pragma GCC unroll 8
        for (int r = 0; r < RR; ++r) {
          const int ky = t - r * SH;  // known in compiling
          if (ky < 0 || ky >= KH) continue;
#pragma GCC unroll 8
          for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_fmadd_ps(k[ky], x[v], acc[r][v]);
        }
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < RR; ++r)
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v)
        _mm512_mask_storeu_ps(Yc + (oy + r) * wo + cx0 + 16 * v, m.out[v],
                              post ? korch_gemm::post_act16(*post, acc[r][v]) : acc[r][v]);
  }

  // the lanes i of sixteen input columns from `from` with from + i in [0, w)


  template <int NV, int S, int KH, int SH>
  void depthwise_rows_chunk(const float* Xc, const float* Wc, float* Yc, int64_t oy0, int64_t oy1, int64_t cx0,
                            float bias, const korch_gemm::Post* post, const float* zeros) const {
    constexpr int RR = NV >= 5 ? 2 : NV >= 3 ? 4 : 8;  // up to sixteen accumulators
    RowMasks m;
    for (int v = 0; v < NV; ++v) {
      const int64_t ox = cx0 + 16 * v;
      m.out[v] = first_lanes(wo - ox);
      for (int64_t kx = 0; kx < kw; ++kx) m.col[v * 8 + kx] = tap_column(ox, S, kx);
    }
    int64_t oy = oy0;
    for (; oy + RR <= oy1; oy += RR)
      depthwise_rows_tile<NV, S, KH, SH, RR>(Xc, Wc, Yc, oy, cx0, bias, post, m, zeros);
    for (; oy < oy1; ++oy) depthwise_rows_tile<NV, S, KH, SH, 1>(Xc, Wc, Yc, oy, cx0, bias, post, m, zeros);
  }

  // channel ch of image ni, output rows [oy0, oy1); post without its bias (added here)
  void depthwise_rows(const float* X, const float* W, float* Y, int64_t ni, int64_t ch, int64_t oy0, int64_t oy1,
                      float bias, const korch_gemm::Post* post) const {
    const float* Xc = X + (ni * c + ch) * h * w;
    const float* Wc = W + ch * kh * kw;
    float* Yc = Y + (ni * co + ch) * ho * wo;
    const float* zeros = zero_row();
    for (int64_t cx0 = 0; cx0 < wo; cx0 += 128) {
      auto go = [&](auto nvc) {
        constexpr int NV = decltype(nvc)::value;
        auto strides = [&](auto khc) {
          constexpr int KH = decltype(khc)::value;
          if (sw == 1) depthwise_rows_chunk<NV, 1, KH, 1>(Xc, Wc, Yc, oy0, oy1, cx0, bias, post, zeros);
          else depthwise_rows_chunk<NV, 2, KH, 2>(Xc, Wc, Yc, oy0, oy1, cx0, bias, post, zeros);
        };
        if (kh == 3) strides(std::integral_constant<int, 3>{});
        else if (kh == 5) strides(std::integral_constant<int, 5>{});
        else strides(std::integral_constant<int, 7>{});
      };
      switch (std::min<int64_t>(8, (wo - cx0 + 15) / 16)) {
        case 1: go(std::integral_constant<int, 1>{}); break;
        case 2: go(std::integral_constant<int, 2>{}); break;
        case 3: go(std::integral_constant<int, 3>{}); break;
        case 4: go(std::integral_constant<int, 4>{}); break;
        case 5: go(std::integral_constant<int, 5>{}); break;
        case 6: go(std::integral_constant<int, 6>{}); break;
        case 7: go(std::integral_constant<int, 7>{}); break;
        default: go(std::integral_constant<int, 8>{}); break;
      }
    }
  }
#endif
  // Note [Row convolution]
  // ~~~~~~~~~~~~~~~~~~~~~~
  // A conv with few input channels a group (RegNet's groups of 8; a stem's 3) gives
  // the direct conv (Note [Direct convolution]) a reduction of only 27-72 taps a tile,
  // against which its tiles' transposed stores into NCHW weigh. As in Note [Row
  // depthwise], a vector is instead sixteen output columns of one channel off the NCHW
  // rows: each tap (input channel, tap row, tap column) one masked load (two and a
  // vpermt2ps at stride 2) feeding RC_CB output channels' FMAs, two vectors at a time,
  // so a weight's broadcast serves two FMAs; the weights packed once as
  // [group][block][tap][RC_CB]. Tasks are (image, group, block of RC_CB channels, band
  // of output rows). On two threads of an Intel Xeon, direct -> rows: regnety_002's
  // grouped 3x3 convs (groups of 8 channels) 24 channels stride 2 from 112 x 112
  // 162 -> 96 us, 56 stride 2 from 56 x 56 104 -> 57, 56 on 28 x 28 92 -> 42; a stem
  // 3 -> 16 stride 2 from 224 x 224 111 -> 87. efficientnet_b0's stem (3 -> 32 with
  // SiLU) the same, 229 against 232. ResNet's 7 x 7 stem (147 taps) ran 938 -> 1171 us,
  // so convs past RC_MAX_TAPS stay direct.
  //
  // Note [Row pairs]: where a row is one vector (wo <= 16: regnety's 14 x 14 and 7 x 7
  // stages), a tile is that vector in two rows, so that a weight's broadcast still
  // serves two FMAs. Those convs went direct before, over panels of 16 channels of which
  // a group of 8 filled half. Where a row is at most half a vector (wo <= 8), a vector
  // holds two rows, and a tile four: regnety's 7 x 7 group conv (368 channels) went
  // 47.9 -> 40.2 us alone on two threads (benchmarks/native_linear.py).
  static constexpr int64_t RC_CB = 8, RC_MAX_CIG = 8, RC_MAX_TAPS = 72, RC_PAIR_WO = 16;

  bool row_conv() const {
#if defined(__AVX512F__)
    const int64_t cig = c / group, cog = co / group;
    return !(cig == 1 && cog == 1) && cig <= RC_MAX_CIG && cig * kh * kw <= RC_MAX_TAPS && b_const &&
           ((sw == 1 && sh == 1) || (sw == 2 && sh == 2)) && dh == 1 && (wo >= ROW_DW_MIN_WO || wo <= RC_PAIR_WO);
#else
    return false;
#endif
  }

  const float* pack_row_conv(const float* W) const {
    std::lock_guard<std::mutex> lock(pack_mu);
    if (packed_from != W) {
      const int64_t cog = co / group, K = (c / group) * kh * kw, nb = (cog + RC_CB - 1) / RC_CB;
      packed.assign((size_t)(group * nb * K * RC_CB + 16), 0.0f);
      float* base = aligned_panels();
      for (int64_t g = 0; g < group; ++g)
        for (int64_t o = 0; o < cog; ++o)
          for (int64_t k = 0; k < K; ++k)
            base[((g * nb + o / RC_CB) * K + k) * RC_CB + o % RC_CB] = W[(g * cog + o) * K + k];
      packed_from = W;
    }
    return aligned_panels();
  }

#if defined(__AVX512F__)
  // how a row_conv_tile's vectors lie (Note [Row pairs]): sixteen columns of one row
  // each, side by side (RC_COLUMNS), or one row each from column ox0 (RC_ROWS), or half
  // a vector a row, rows 2v and 2v + 1 (RC_HALVES: rows of at most 8 columns)
  enum RowTile { RC_COLUMNS, RC_ROWS, RC_HALVES };

  // NV vectors from column ox0 of output row oy (as M lays them; no row from oy_end
  // on), channels [o0, o0 + nc) of group g
  template <int NV, int S, int M = RC_COLUMNS>
  KORCH_INLINE void row_conv_tile(const float* Xg, const float* Wb, float* Yo, int64_t oy, int64_t ox0, int64_t nc,
                                  const float* bias, const korch_gemm::Post* post, const TapColumn* cols,
                                  const float* zeros, int64_t oy_end = 0) const {
    const int64_t cig = c / group;
    __m512 acc[RC_CB][NV];
#pragma GCC unroll 8
    for (int j = 0; j < RC_CB; ++j)
#pragma GCC unroll 2
      for (int v = 0; v < NV; ++v) acc[j][v] = _mm512_set1_ps(bias[j]);
    const float* wk = Wb;
    for (int64_t ci = 0; ci < cig; ++ci)
      for (int64_t ky = 0; ky < kh; ++ky) {
        constexpr int R = M == RC_HALVES ? 2 * NV : NV;  // input rows a tap row reads
        const float* rows[R];
#pragma GCC unroll 4
        for (int v = 0; v < R; ++v) {
          const int64_t iy = (oy + (M == RC_COLUMNS ? 0 : v)) * S - pt + ky;
          rows[v] = iy >= 0 && iy < h ? Xg + (ci * h + iy) * w : zeros;
        }
        for (int64_t kx = 0; kx < kw; ++kx, wk += RC_CB) {
          __m512 x[NV];
#pragma GCC unroll 2
          for (int v = 0; v < NV; ++v) {
            if constexpr (M == RC_HALVES) {  // row 2v in the low lanes, 2v + 1 in the high
              const TapColumn& tc = cols[kx];
              if constexpr (S == 1) {
                const __mmask16 lo = tc.lo & 0xFF;
                x[v] = _mm512_mask_loadu_ps(_mm512_maskz_loadu_ps(lo, rows[2 * v] + tc.off), (__mmask16)(lo << 8),
                                            rows[2 * v + 1] + tc.off - 8);
              } else {
                const __m512i evens = even_lanes();
                x[v] = _mm512_permutex2var_ps(_mm512_maskz_loadu_ps(tc.lo, rows[2 * v] + tc.off), evens,
                                              _mm512_maskz_loadu_ps(tc.lo, rows[2 * v + 1] + tc.off));
              }
            } else {
              x[v] = tap_load<S>(rows[v], cols[(M == RC_ROWS ? 0 : v * kw) + kx]);
            }
          }
#pragma GCC unroll 8
          for (int j = 0; j < RC_CB; ++j) {
            const __m512 k = _mm512_set1_ps(wk[j]);
#pragma GCC unroll 2
            for (int v = 0; v < NV; ++v) acc[j][v] = _mm512_fmadd_ps(k, x[v], acc[j][v]);
          }
        }
      }
    const int64_t HW = ho * wo;
#pragma GCC unroll 8
    for (int j = 0; j < RC_CB; ++j)  // (a loop to nc indexes acc at run time: acc in memory)
#pragma GCC unroll 2
      for (int v = 0; v < NV; ++v) {
        if (j >= nc) break;
        const __m512 out = post ? korch_gemm::post_act16(*post, acc[j][v]) : acc[j][v];
        if constexpr (M == RC_HALVES) {
          const int64_t y = oy + 2 * v;
          const __mmask16 m = first_lanes(wo);
          _mm512_mask_storeu_ps(Yo + j * HW + y * wo, m, out);
          if (y + 1 < oy_end) _mm512_mask_storeu_ps(Yo + j * HW + (y + 1) * wo - 8, (__mmask16)(m << 8), out);
        } else {
          const int64_t ox = M == RC_ROWS ? ox0 : ox0 + 16 * v, y = M == RC_ROWS ? oy + v : oy;
          _mm512_mask_storeu_ps(Yo + j * HW + y * wo + ox, first_lanes(wo - ox), out);
        }
      }
  }

  // channels [blk * RC_CB, + RC_CB) of group g, image ni, output rows [oy0, oy1)
  template <int S>
  void row_conv_band(const float* X, const float* Wr, float* Y, int64_t ni, int64_t g, int64_t blk, int64_t oy0,
                     int64_t oy1, const float* bias, const korch_gemm::Post* post) const {
    const int64_t cig = c / group, cog = co / group, K = cig * kh * kw, nb = (cog + RC_CB - 1) / RC_CB;
    const int64_t nc = std::min(RC_CB, cog - blk * RC_CB), nvec = (wo + 15) / 16;
    thread_local std::vector<TapColumn> cols;  // [vector * kw + kx]
    cols.resize((size_t)(nvec * kw));
    for (int64_t v = 0; v < nvec; ++v)
      for (int64_t kx = 0; kx < kw; ++kx) cols[(size_t)(v * kw + kx)] = tap_column(16 * v, S, kx);
    const float* zeros = zero_row();
    const float* Xg = X + (ni * c + g * cig) * h * w;
    const float* Wb = Wr + (g * nb + blk) * K * RC_CB;
    float* Yo = Y + (ni * co + g * cog + blk * RC_CB) * ho * wo;
    if (wo <= 8) {  // Note [Row pairs]: half a vector a row, four rows a tile
      int64_t oy = oy0;
      for (; oy + 4 <= oy1; oy += 4)
        row_conv_tile<2, S, RC_HALVES>(Xg, Wb, Yo, oy, 0, nc, bias, post, cols.data(), zeros, oy1);
      for (; oy < oy1; oy += 2)
        row_conv_tile<1, S, RC_HALVES>(Xg, Wb, Yo, oy, 0, nc, bias, post, cols.data(), zeros, oy1);
      return;
    }
    if (nvec == 1) {  // Note [Row pairs]: a row is one vector; two rows a tile
      int64_t oy = oy0;
      for (; oy + 2 <= oy1; oy += 2)
        row_conv_tile<2, S, RC_ROWS>(Xg, Wb, Yo, oy, 0, nc, bias, post, cols.data(), zeros);
      if (oy < oy1) row_conv_tile<1, S>(Xg, Wb, Yo, oy, 0, nc, bias, post, cols.data(), zeros);
      return;
    }
    for (int64_t oy = oy0; oy < oy1; ++oy) {
      int64_t v = 0;
      for (; v + 2 <= nvec; v += 2)
        row_conv_tile<2, S>(Xg, Wb, Yo, oy, 16 * v, nc, bias, post, cols.data() + v * kw, zeros);
      if (v < nvec) row_conv_tile<1, S>(Xg, Wb, Yo, oy, 16 * v, nc, bias, post, cols.data() + v * kw, zeros);
    }
  }
#endif

  bool blocked_depthwise() const {
#if defined(__AVX2__) && defined(__FMA__)
    return kh * kw <= PADDED_TAPS;
#else
    return false;
#endif
  }

  // Note [Few-pixel pointwise]: a 1x1 convolution over fewer pixels than a vector
  // (MobileNetV3's head, 576 -> 1024 on one pixel; squeeze-excite's 1x1 convs) is a GEMV
  // over its weights: out^T[pixels, Co] = X^T @ W^T with the weights as korch_gemm's
  // packed right operand, every panel read once, tasks over panels. Through the
  // pointwise rows kernel it computed 16 pixels of which one was real (575 us for
  // 576 -> 1024 against onnxruntime's 86).
  int conv_few_pixels(const float* X, const float* W, float* Y, void* const* ptrs, int T) const {
    const int64_t cig = c / group, cog = co / group, HW = ho * wo, K = cig;
    const float* Wp = scale_panels(pack(W, group, cog * K, K, cog, 1, K), korch_gemm::packed_size(K, cog), K, korch_gemm::NR);
    const int64_t per = korch_gemm::packed_size(K, cog), panels = (cog + korch_gemm::NR - 1) / korch_gemm::NR;
    const int64_t outer = n * group;
    const int64_t parts = std::min<int64_t>(panels, outer >= T ? 1 : (T + outer - 1) / outer);
    parallel_for(outer * parts, T, [&](int64_t t) {
      const int64_t part = t % parts, g = (t / parts) % group, ni = t / (parts * group);
      const int64_t q0 = panels * part / parts, q1 = panels * (part + 1) / parts;
      if (q1 <= q0) return;
      const float* xg = X + (ni * c + g * cig) * HW;
      float* yg = Y + (ni * co + g * cog) * HW;
      korch_gemm::gemm(cog, K, xg, 1, HW, Wp + g * per, yg, 1, HW, 0, HW, q0, q1);
      const int64_t n0 = q0 * korch_gemm::NR, n1 = std::min(cog, q1 * korch_gemm::NR);
      const int64_t base = (ni * co + g * cog) * HW;
      epilogue(Y, ptrs, base + n0 * HW, base + n1 * HW);
    });
    return 0;
  }

  // depthwise: one output channel per input channel; the valid output columns of each
  // tap are computed once, the rows accumulate in L1
  void depthwise_channel(const float* X, const float* W, float* Y, int64_t ni, int64_t ch) const {
    const float* x = X + (ni * c + ch) * h * w;
    const float* k = W + ch * kh * kw;
    float* y = Y + (ni * co + ch) * ho * wo;
    int64_t lo[16], hi[16], shift[16];
    const bool small = kw <= 16;
    for (int64_t kx = 0; kx < kw && small; ++kx) {
      shift[kx] = kx * dw - pl;  // ix = ox * sw + shift
      lo[kx] = std::min(wo, shift[kx] >= 0 ? 0 : (-shift[kx] + sw - 1) / sw);
      hi[kx] = std::max(lo[kx], std::min(wo, (w - 1 - shift[kx]) >= 0 ? (w - 1 - shift[kx]) / sw + 1 : 0));
    }
    // the common 3-wide, stride-1, undilated case: [L3, H3) where all three taps are in
    const bool fast3 = kw == 3 && sw == 1 && dw == 1;
    int64_t L3 = 0, H3 = 0;
    if (fast3) {
      L3 = std::max({lo[0], lo[1], lo[2]});
      H3 = std::max(L3, std::min({hi[0], hi[1], hi[2]}));
    }
    for (int64_t oy = 0; oy < ho; ++oy) {
      float* __restrict yr = y + oy * wo;
      const int64_t iy0 = oy * sh - pt;
      if (fast3 && kh == 3 && dh == 1 && iy0 >= 0 && iy0 + 2 < h && H3 > L3) {
        // all three rows inside: the nine taps summed in registers, one store per
        // output (the tap-by-tap loop below loads and stores the row once per tap row)
        const float* r0 = x + iy0 * w;
        const float* r1 = r0 + w;
        const float* r2 = r1 + w;
        const float k00 = k[0], k01 = k[1], k02 = k[2], k10 = k[3], k11 = k[4], k12 = k[5], k20 = k[6],
                    k21 = k[7], k22 = k[8];
        const float* __restrict a0 = r0 + shift[0];
        const float* __restrict b0 = r1 + shift[0];
        const float* __restrict c0 = r2 + shift[0];
        for (int64_t ox = L3; ox < H3; ++ox)
          yr[ox] = k00 * a0[ox] + k01 * a0[ox + 1] + k02 * a0[ox + 2] + k10 * b0[ox] + k11 * b0[ox + 1] +
                   k12 * b0[ox + 2] + k20 * c0[ox] + k21 * c0[ox + 1] + k22 * c0[ox + 2];
        for (int64_t ox = 0; ox < wo; ++ox) {  // the edge columns, tap by tap
          if (ox == L3) ox = H3;
          if (ox >= wo) break;
          float acc = 0.0f;
          for (int64_t ky = 0; ky < 3; ++ky)
            for (int64_t kx = 0; kx < 3; ++kx)
              if (ox >= lo[kx] && ox < hi[kx]) acc += k[ky * 3 + kx] * x[(iy0 + ky) * w + ox + shift[kx]];
          yr[ox] = acc;
        }
        continue;
      }
      for (int64_t ox = 0; ox < wo; ++ox) yr[ox] = 0.0f;
      for (int64_t ky = 0; ky < kh; ++ky) {
        const int64_t iy = oy * sh - pt + ky * dh;
        if (iy < 0 || iy >= h) continue;
        const float* xr = x + iy * w;
        if (fast3) {  // 3 taps in one pass where all are inside the row, the edges tap by tap
          const float* kr = k + ky * 3;
          const float w0 = kr[0], w1 = kr[1], w2 = kr[2];
          const float* __restrict a0 = xr + shift[0];
          const float* __restrict a1 = xr + shift[1];
          const float* __restrict a2 = xr + shift[2];
          for (int64_t ox = L3; ox < H3; ++ox) yr[ox] += w0 * a0[ox] + w1 * a1[ox] + w2 * a2[ox];
          for (int64_t kx = 0; kx < 3; ++kx) {
            const float wk = kr[kx];
            const float* xs = xr + shift[kx];
            for (int64_t ox = lo[kx], e = std::min(hi[kx], L3); ox < e; ++ox) yr[ox] += wk * xs[ox];
            for (int64_t ox = std::max(lo[kx], H3); ox < hi[kx]; ++ox) yr[ox] += wk * xs[ox];
          }
          continue;
        }
        for (int64_t kx = 0; kx < kw; ++kx) {
          const float wk = k[ky * kw + kx];
          int64_t s0, l0, h0;
          if (small) {
            s0 = shift[kx], l0 = lo[kx], h0 = hi[kx];
          } else {
            s0 = kx * dw - pl;
            l0 = std::min(wo, s0 >= 0 ? 0 : (-s0 + sw - 1) / sw);
            h0 = std::max(l0, std::min(wo, (w - 1 - s0) >= 0 ? (w - 1 - s0) / sw + 1 : 0));
          }
          if (sw == 1) {
            const float* __restrict xs = xr + s0;
            for (int64_t ox = l0; ox < h0; ++ox) yr[ox] += wk * xs[ox];
          } else {
            const float* __restrict xs = xr + s0;
            for (int64_t ox = l0; ox < h0; ++ox) yr[ox] += wk * xs[ox * sw];
          }
        }
      }
    }
  }

  // Note [Reflected padding]
  // ~~~~~~~~~~~~~~~~~~~~~~~~~
  // ONNX's Pad in reflect or edge mode ahead of a conv (a style-transfer net pads each
  // 3x3 conv's input so) is the conv's own padding in that mode
  // (korch/kernels/epilogue.py, _input_pad): the direct conv's padded copy of the input
  // reflects its rows and columns instead of writing zeros, so the padded tensor is
  // never a kernel's output. As a generated kernel of its own, the pad of a
  // 32 x 32 x 32 input took 43-46 us in place, against a conv of 80.
  //
  // Input index i of a padded row or column (i < 0 or i >= n in the pad): reflected
  // about the edge element, or the edge element; clamped as well, for the rows past the
  // last output that a band's copy may reach
  int64_t mirrored(int64_t i, int64_t n) const {
    if (pad_mode == 1) {
      i = i < 0 ? -i : i;
      i = i >= n ? 2 * (n - 1) - i : i;
    }
    return std::min(std::max<int64_t>(i, 0), n - 1);
  }

  // padded row y (input row y of plane, h x w, maybe in the pad) into d[0, Wpd), the
  // input's columns from d[pl]
  void mirrored_row(float* __restrict d, const float* __restrict plane, int64_t y, int64_t Wpd) const {
    const float* __restrict src = plane + mirrored(y, h) * w;
    for (int64_t x = 0; x < pl; ++x) d[x] = src[mirrored(x - pl, w)];
    for (int64_t x = 0; x < w; ++x) d[pl + x] = src[x];
    for (int64_t x = pl + w; x < Wpd; ++x) d[x] = src[mirrored(x - pl, w)];
  }

  // Note [Direct convolution]
  // ~~~~~~~~~~~~~~~~~~~~~~~~~~
  // out^T[pixels, Co] = im2col^T[pixels, KK] @ W^T[KK, Co] without the im2col matrix:
  // the register tile (MR pixels of one output row x NR channels) broadcasts its
  // left operand straight from the input, A(p, k) = Xp[base + p * sw + koff[k]] with
  // k = (ci, ky, kx), over a zero-padded copy Xp of the input (every tap inside), and
  // reads the weights packed once (korch_gemm::pack_b panels). This is MLAS's direct
  // NCHWc kernel in NCHW. The im2col path wrote and read back KK x pixels floats per
  // block and ran at 0.68-0.78x onnxruntime on 3x3 convs; packing im2col panels on the
  // fly instead cost a third of the time in the packing (Co = 32: six tiles per panel).
  //
  // Note [Direct convolution bands]
  // ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
  // A task is one panel (a pair under Note [Wide tiles]) over a band of output rows
  // (up to BAND_TILES tiles), with K blocked outside the rows: a block of packed weights
  // is read once per band, and the band's tiles are summed over K in a task-local
  // buffer, stored to Y once. A row is cut into tiles as equal as they can be: with a
  // task per output row and 6-row tiles, resnet18's 7x7 stage (512 channels, 9.4 MB of
  // weights) read every weight once per row and ran 7 pixels as 6 + 1, at 0.56x
  // onnxruntime on one Zen 4 core; banded, wide and balanced, 0.93x.
  //
  // Note [Flat pointwise rows]: a 1x1 convolution (unit strides, no padding) has its
  // pixels contiguous across output rows, so with flat it runs as one row of H x W
  // pixels: a 7x7 output is 49 pixels in tiles of 10 and 9, not seven rows of 4 + 3 (a
  // 3-row tile has 6 accumulators, fewer than the FMA pipes' latency needs busy).
  int conv_direct(const float* X, const float* Wp, float* Y, void* const* ptrs, int T, bool flat = false) const {
#if defined(__AVX2__) && defined(__FMA__)
    using korch_gemm::MR;
    using korch_gemm::NR;
    // the geometry as the direct conv sees it (flat: one row of every pixel)
    const int64_t ho = flat ? 1 : this->ho, wo = flat ? this->ho * this->wo : this->wo;
    const int64_t h = flat ? 1 : this->h, w = flat ? this->h * this->w : this->w;
    const int64_t cig = c / group, cog = co / group, HW = ho * wo, KK = cig * kh * kw;
    const int64_t per = korch_gemm::packed_size(KK, cog), panels = (cog + NR - 1) / NR;
    // the padded input: every tap of every output pixel inside
    const int64_t Hp = std::max(h + pt, (ho - 1) * sh + (kh - 1) * dh + 1);
    const int64_t Wpd = std::max(w + pl, (wo - 1) * sw + (kw - 1) * dw + 1);
    const bool pad = pt || pl || Hp != h || Wpd != w;
    // Note [Direct convolution bands]: a row's tiles as equal as they can be (7 pixels:
    // 4 + 3, not 6 + 1), and a task is one panel (two with Note [Wide tiles]) over a
    // band of rows, K blocked outside the rows, so a block of weights is read once per
    // band, not once per row
    // Note [Four-panel tiles] (korch_gemm.h): rows in tiles of 7 over four panels, where
    // the channels come in whole fours of panels. A flat row (Note [Flat pointwise rows])
    // of over 28 pixels stays on two panels: its tasks are its groups of panels, and
    // 1152 -> 192 on 7 x 7 in three groups of four ran 2 : 1 on two threads (108 -> 139-145 us)
#if defined(__AVX512F__)
    const bool quad = panels % 4 == 0 && (wo <= 4 * korch_gemm::QR || !flat);
    const int64_t TR = quad ? korch_gemm::QR : korch_gemm::WR, PP = quad ? 4 : 2, LD = quad ? korch_gemm::QN : korch_gemm::WN;
#else
    constexpr bool quad = false;
    constexpr int64_t TR = MR, PP = 1, LD = NR;
#endif
    const int64_t TS = TR * LD;
    const int64_t tiles = (wo + TR - 1) / TR, pgroups = (panels + PP - 1) / PP;
    // a block of K over four panels: half the rows, so that it stays 32 KB
    const int64_t kcb = std::min<int64_t>(KK, quad ? korch_gemm::KC / 2 : korch_gemm::KC);
    const int64_t outer = n * group * pgroups;
    int64_t rows = std::max<int64_t>(1, std::min<int64_t>(ho, BAND_TILES / tiles));
    if (outer * ((ho + rows - 1) / rows) < 2 * T) rows = std::max<int64_t>(1, ho * outer / (2 * T));
    const int64_t bands = (ho + rows - 1) / rows;
    // one task per band (a stem conv: few channels out, a large input): each task pads
    // its band's rows itself, where it reads them, instead of one padded copy of the
    // whole input written and read back through memory
    const bool band_pad = pad && pgroups == 1 && (bands > 1 || group > 1);
    const int64_t BH = band_pad ? (rows - 1) * sh + (kh - 1) * dh + 1 : Hp;
    const float* Xp = X;
    static thread_local std::vector<float> padded;
    if (pad && !band_pad) {
      padded.resize((size_t)(n * c * Hp * Wpd));
      float* P = padded.data();
      // planes cut into parts of rows where they are fewer than the threads can share
      // evenly (a stem's three planes: two threads copied them 2 : 1)
      const int64_t parts = n * c >= 4 * T ? 1 : std::min<int64_t>(Hp, (4 * T + n * c - 1) / (n * c));
      parallel_for(n * c * parts, T, [&](int64_t t) {
        const int64_t plane = t / parts, part = t % parts;
        float* dst = P + plane * Hp * Wpd;
        for (int64_t r = Hp * part / parts; r < Hp * (part + 1) / parts; ++r) {
          float* d = dst + r * Wpd;
          const int64_t y = r - pt;
          if (pad_mode) {
            mirrored_row(d, X + plane * h * w, y, Wpd);
            continue;
          }
          if (y < 0 || y >= h) {
            std::memset(d, 0, sizeof(float) * Wpd);
            continue;
          }
          std::memset(d, 0, sizeof(float) * pl);
          std::memcpy(d + pl, X + (plane * h + y) * w, sizeof(float) * w);
          std::memset(d + pl + w, 0, sizeof(float) * (Wpd - pl - w));
        }
      });
      Xp = P;
    }
    std::vector<int64_t> koff((size_t)KK);
    for (int64_t ci = 0, k = 0; ci < cig; ++ci)
      for (int64_t ky = 0; ky < kh; ++ky)
        for (int64_t kx = 0; kx < kw; ++kx) koff[(size_t)k++] = (ci * BH + ky * dh) * Wpd + kx * dw;
    const int64_t* kt = koff.data();
    std::vector<float> bias_buf;
    const korch_gemm::Post post = post_for(ptrs, bias_buf);
    parallel_for(outer * bands, T, [&](int64_t t) {
      const int64_t band = t % bands, pg = (t / bands) % pgroups, g = (t / (bands * pgroups)) % group,
                    ni = t / (bands * pgroups * group);
      const int64_t oy0 = band * rows, oy1 = std::min(ho, oy0 + rows), q0 = pg * PP;
      const int np = (int)std::min<int64_t>(PP, panels - q0);
      const float* xg = Xp + (ni * c + g * cig) * Hp * Wpd;  // row oy at xg + (oy - y0) * sh * Wpd
      int64_t y0 = 0;
      if (band_pad) {
        static thread_local std::vector<float> band_rows;
        band_rows.resize((size_t)(cig * BH * Wpd));
        // plain loops, not memset/memcpy: a grouped conv's rows are a few floats
        // (regnety's 7x7 stage: 3,300 libc calls a conv)
        for (int64_t ci = 0; ci < cig; ++ci)
          for (int64_t r = 0; r < BH; ++r) {
            float* __restrict d = band_rows.data() + (ci * BH + r) * Wpd;
            const int64_t iy = oy0 * sh + r - pt;
            if (pad_mode) {
              mirrored_row(d, X + (ni * c + g * cig + ci) * h * w, iy, Wpd);
              continue;
            }
            if (iy < 0 || iy >= h) {
              for (int64_t x = 0; x < Wpd; ++x) d[x] = 0.0f;
              continue;
            }
            const float* __restrict src = X + ((ni * c + g * cig + ci) * h + iy) * w;
            for (int64_t x = 0; x < pl; ++x) d[x] = 0.0f;
            for (int64_t x = 0; x < w; ++x) d[pl + x] = src[x];
            for (int64_t x = pl + w; x < Wpd; ++x) d[x] = 0.0f;
          }
        xg = band_rows.data(), y0 = oy0;
      }
      const float* wq = Wp + g * per + q0 * KK * NR;
      // the band's tiles, summed over K (64-byte aligned for the wide kernel's stores)
      struct alignas(64) Line {
        float f[16];
      };
      static thread_local std::vector<Line> accv;
      if (accv.size() < (size_t)(rows * tiles * TS / 16)) accv.resize((size_t)(rows * tiles * TS / 16));
      float* acc = reinterpret_cast<float*>(accv.data());
      const int64_t n0 = q0 * NR, nn = std::min<int64_t>(np * NR, cog - n0);
      // Note [Register post-ops]: a tile's row is LD channels, its bias zero past nn
      alignas(64) float bt[64] = {};
      korch_gemm::Post tpost = post;
      if (post.bias) {
        for (int64_t j = 0; j < nn; ++j) bt[j] = post.bias[g * cog + n0 + j];
        tpost.bias = bt;
      }
      for (int64_t kk = 0; kk < KK; kk += kcb) {
        const int64_t kc = std::min(kcb, KK - kk);
        const int64_t* ko = kt + kk;
        const auto off = [ko](int64_t k) { return ko[k]; };
        // Note [Weights fetched ahead]: the band's tiles share out the next block's lines
        const int64_t next = std::min(kcb, KK - kk - kc), nt = (oy1 - oy0) * tiles;
        // the rows of the band over this block of K; with_post: a std::bool_constant,
        // so the loop without a post is the loop as it was (a test of the post inside
        // it cost the stem conv 25% with no post: 193 -> 245 us, one Zen 4 core)
        auto block = [&](auto with_post) {
          for (int64_t oy = oy0; oy < oy1; ++oy) {
            const float* xrow = xg + (oy - y0) * sh * Wpd;
            for (int64_t i = 0; i < tiles; ++i) {
              const int64_t ox0 = i * wo / tiles, mr = (i + 1) * wo / tiles - ox0;
              float* tile = acc + ((oy - oy0) * tiles + i) * TS;
#if defined(__AVX512F__)
              const auto f = korch_gemm::fetch_share(wq + (kk + kc) * NR, next, (oy - oy0) * tiles + i, nt, kc);
              if (quad)
                korch_gemm::micro_quad(kc, xrow + ox0 * sw, sw, off, mr, wq + kk * NR, KK * NR, tile, kk > 0, f.pf, f.n,
                                       f.step);
              else
                korch_gemm::micro_wide(kc, xrow + ox0 * sw, sw, off, mr, wq + kk * NR, KK * NR, np, tile, kk > 0, f.pf,
                                       f.n, f.step);
              if constexpr (decltype(with_post)::value) korch_gemm::post_tile16(tpost, tile, mr, LD, np);
#else
              korch_gemm::micro_at(kc, xrow + ox0 * sw, sw, off, mr, wq + kk * NR, tile, kk > 0);
              if constexpr (decltype(with_post)::value) korch_gemm::post_tile(tpost, tile, mr, LD, np);
#endif
            }
          }
        };
        if (post_steps && kk + kc == KK) block(std::true_type{});
        else block(std::false_type{});
      }
      float* yg = Y + (ni * co + g * cog + n0) * HW;
      for (int64_t oy = oy0; oy < oy1; ++oy)
        for (int64_t i = 0; i < tiles; ++i) {
          const int64_t ox0 = i * wo / tiles, mr = (i + 1) * wo / tiles - ox0;
          const float* tile = acc + ((oy - oy0) * tiles + i) * TS;
#if defined(__AVX512F__)
          korch_gemm::store_transposed(tile, mr, LD, nn, yg + oy * wo + ox0, HW);  // Note [Transposed tile stores]
#else
          for (int64_t j = 0; j < nn; ++j) {
            float* cp = yg + j * HW + oy * wo + ox0;
            for (int64_t r = 0; r < mr; ++r) cp[r] = tile[r * LD + j];
          }
#endif
        }
      for (int64_t j = 0; j < nn; ++j) {
        const int64_t base = (ni * co + g * cog + n0 + j) * HW;
        epilogue(Y, ptrs, base + oy0 * wo, base + oy1 * wo, post_steps);
      }
    });
    return 0;
#else
    return -1;  // korch_gemm::available is false: conv() does not come here
#endif
  }

#if defined(__AVX512F__)
  // Note [Winograd convolution]
  // ~~~~~~~~~~~~~~~~~~~~~~~~~~~
  // A dense 3x3 conv at unit strides computes each 2x2 block of outputs (a tile) from a
  // 4x4 block of input as Y = A^T [(G g G^T) . (B^T d B)] A (Lavin and Gray, "Fast
  // Algorithms for Convolutional Neural Networks", 2016: F(2x2, 3x3)): 16 products a
  // tile and channel pair instead of 36, so the reduction becomes 16 GEMMs, one a
  // position of the 4x4 transform, U_p [co x ci] @ V_p [ci x tiles], with 2.25x fewer
  // FMAs. The transforms are adds only. Neither onnxruntime's MLAS nor OpenVINO's
  // oneDNN uses it for fp32 on this CPU; it was the one way left to beat their direct
  // convs, which korch's already matched. F(2x2, 3x3) keeps the error of a direct conv
  // within a few ulps of the sums (F(4x4, 3x3)'s larger transform constants cost
  // about ten times that). A task is a block of at most 64 tiles (whole tile rows where
  // a row has at most 64) and of output channels: its input transformed into V
  // (thread-local, [16][ci][tiles]), the 16 GEMMs through Note [Wide pointwise tiles]'
  // micro kernel into M ([16][co][tiles]), then the output transform with bias and
  // activation in registers, written to the NCHW rows. The transformed weights
  // (16/9 of the direct conv's) are packed once as korch_gemm's left panels. A reflected
  // or edge pad (Note [Reflected padding]) is read where the input transform loads.
  static constexpr int64_t WG_TILES = 64, WG_CO = 128;

  bool winograd() const {
    static const bool on = [] {
      const char* e = std::getenv("KORCH_WINOGRAD");
      return !(e && e[0] == '0');
    }();
    return on && korch_gemm::wide && op == 1 && kh == 3 && kw == 3 && sh == 1 && sw == 1 && dh == 1 && dw == 1 &&
           group == 1 && !pools && b_const && c >= 16 && co >= 16 &&
           ho * wo >= WG_MIN_PIXELS;
  }
  static constexpr int64_t WG_MIN_PIXELS = 196;

  // U_p = G g G^T for each filter, packed per position p (16 x packed_a_size(co, c))
  const float* pack_winograd(const float* W) const {
    std::lock_guard<std::mutex> lock(pack_mu);
    if (packed_from != W) {
      const int64_t per = korch_gemm::packed_a_size(co, c);
      std::vector<float> U((size_t)(16 * co * c));
      for (int64_t o = 0; o < co; ++o)
        for (int64_t i = 0; i < c; ++i) {
          const float* g = W + (o * c + i) * 9;
          float t[4][3];  // G g: rows of the 4x3
          for (int64_t x = 0; x < 3; ++x) {
            t[0][x] = g[x];
            t[1][x] = 0.5f * (g[x] + g[3 + x] + g[6 + x]);
            t[2][x] = 0.5f * (g[x] - g[3 + x] + g[6 + x]);
            t[3][x] = g[6 + x];
          }
          for (int64_t r = 0; r < 4; ++r) {  // (G g) G^T
            const float u[4] = {t[r][0], 0.5f * (t[r][0] + t[r][1] + t[r][2]), 0.5f * (t[r][0] - t[r][1] + t[r][2]),
                                t[r][2]};
            for (int64_t k = 0; k < 4; ++k) U[(size_t)(((r * 4 + k) * co + o) * c + i)] = u[k];
          }
        }
      packed.assign((size_t)(16 * per + 16), 0.0f);
      for (int64_t p = 0; p < 16; ++p) korch_gemm::pack_a(U.data() + p * co * c, co, c, c, 1, aligned_panels() + p * per);
      packed_from = W;
    }
    return aligned_panels();
  }

  // lanes l of a load from column c0 (of a row of w) that lie within it
  static __mmask16 row_lanes(int64_t c0, int64_t w) {
    const int64_t lo = std::max<int64_t>(0, -c0), hi = std::min<int64_t>(16, w - c0);
    return hi <= lo ? (__mmask16)0 : (__mmask16)(((1u << hi) - 1u) & ~((1u << lo) - 1u));
  }

  // V[p][ci][at + t] = (B^T d B)_p of tile (ty, tx0 + t), t < nt <= 16, channel ci
  void winograd_in(const float* Xn, float* V, int64_t nv, int64_t ty, int64_t tx0, int64_t nt, int64_t at) const {
    const __m512i evens = even_lanes();
    const __m512i odds = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
    const __m512i next_e = _mm512_set_epi32(16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1);
    const __m512i next_o = _mm512_set_epi32(17, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1);
    const int64_t c0 = 2 * tx0 - pl;
    const __mmask16 m0 = row_lanes(c0, w), m1 = row_lanes(c0 + 16, w), m2 = row_lanes(c0 + 32, w);
    const __mmask16 out = (__mmask16)((1u << nt) - 1u);
    const bool border = c0 < 0 || c0 + 2 * nt + 2 > w;
    const __m512 z = _mm512_setzero_ps();
    for (int64_t ci = 0; ci < c; ++ci) {
      __m512 d[4][4];
      for (int r = 0; r < 4; ++r) {
        int64_t iy = 2 * ty - pt + r;
        if (iy < 0 || iy >= h) {
          if (!pad_mode) {
            d[r][0] = d[r][1] = d[r][2] = d[r][3] = z;
            continue;
          }
          iy = mirrored(iy, h);  // Note [Reflected padding]
        }
        const float* plane_row = Xn + (ci * h + iy) * w;
        const float* row = plane_row + c0;
        __m512 a = _mm512_maskz_loadu_ps(m0, row), b = _mm512_maskz_loadu_ps(m1, row + 16),
               e = _mm512_maskz_loadu_ps(m2, row + 32);
        if (pad_mode && border) {  // the columns in the pad the tiles read, reflected
          alignas(64) float tmp[48];
          _mm512_store_ps(tmp, a), _mm512_store_ps(tmp + 16, b), _mm512_store_ps(tmp + 32, e);
          for (int64_t x = c0; x < 0; ++x) tmp[x - c0] = plane_row[mirrored(x, w)];
          for (int64_t x = std::max(w, c0); x < c0 + 2 * nt + 2; ++x) tmp[x - c0] = plane_row[mirrored(x, w)];
          a = _mm512_load_ps(tmp), b = _mm512_load_ps(tmp + 16), e = _mm512_load_ps(tmp + 32);
        }
        d[r][0] = _mm512_permutex2var_ps(a, evens, b);  // column 2t
        d[r][1] = _mm512_permutex2var_ps(a, odds, b);   // 2t + 1
        d[r][2] = _mm512_permutex2var_ps(d[r][0], next_e, e);
        d[r][3] = _mm512_permutex2var_ps(d[r][1], next_o, e);
      }
      __m512 t[4][4];  // B^T d
      for (int j = 0; j < 4; ++j) {
        t[0][j] = _mm512_sub_ps(d[0][j], d[2][j]);
        t[1][j] = _mm512_add_ps(d[1][j], d[2][j]);
        t[2][j] = _mm512_sub_ps(d[2][j], d[1][j]);
        t[3][j] = _mm512_sub_ps(d[1][j], d[3][j]);
      }
      float* v = V + ci * nv + at;
      const int64_t ps = c * nv;  // a position's stride
      for (int i = 0; i < 4; ++i) {  // (B^T d) B
        _mm512_mask_storeu_ps(v + (i * 4 + 0) * ps, out, _mm512_sub_ps(t[i][0], t[i][2]));
        _mm512_mask_storeu_ps(v + (i * 4 + 1) * ps, out, _mm512_add_ps(t[i][1], t[i][2]));
        _mm512_mask_storeu_ps(v + (i * 4 + 2) * ps, out, _mm512_sub_ps(t[i][2], t[i][1]));
        _mm512_mask_storeu_ps(v + (i * 4 + 3) * ps, out, _mm512_sub_ps(t[i][1], t[i][3]));
      }
    }
  }

  int conv_winograd(const float* X, const float* W, float* Y, void* const* ptrs, int T) const {
    using korch_gemm::MR;
    const int64_t HW = ho * wo, th = (ho + 1) / 2, tw = (wo + 1) / 2;
    const int64_t per = korch_gemm::packed_a_size(co, c);
    const float* U = scale_panels(pack_winograd(W), 16 * per, c, MR);  // Note [Scaled inputs]
    const int64_t tc = std::min(tw, WG_TILES), tr = std::max<int64_t>(1, WG_TILES / tc);
    const int64_t rblocks = (th + tr - 1) / tr, cblocks_x = (tw + tc - 1) / tc, tblocks = rblocks * cblocks_x;
    const int64_t ptiles = (co + MR - 1) / MR;
    int64_t oblocks = (co + WG_CO - 1) / WG_CO;
    // blocks of channels only as many as the threads need: each block transforms the input
    // again (four for 256 -> 256 on 14 x 14 ran 705-751 us, two 650-683)
    if (n * tblocks * oblocks < T) oblocks = std::min(ptiles, (T + n * tblocks - 1) / (n * tblocks));
    const int64_t tiles_per = (ptiles + oblocks - 1) / oblocks;
    oblocks = (ptiles + tiles_per - 1) / tiles_per;
    std::vector<float> bias_buf;
    korch_gemm::Post post = post_for(ptrs, bias_buf);
    const float* bias = post_steps ? post.bias : nullptr;
    const float* sum = post_steps ? post.sum : nullptr;  // Note [Residual in registers]
    const bool act = post_steps > 0;
    const __m512i lo_idx = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    const __m512i hi_idx = _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
    parallel_for(n * tblocks * oblocks, T, [&](int64_t t) {
      const int64_t ob = t % oblocks, tb = (t / oblocks) % tblocks, ni = t / (oblocks * tblocks);
      const int64_t ty0 = (tb / cblocks_x) * tr, ty1 = std::min(th, ty0 + tr);
      const int64_t tx0 = (tb % cblocks_x) * tc, ncol = std::min(tc, tw - tx0), nv = (ty1 - ty0) * ncol;
      const int64_t p0 = ob * tiles_per, p1 = std::min(ptiles, p0 + tiles_per);
      const int64_t o0 = p0 * MR, o1 = std::min(co, p1 * MR);
      thread_local std::vector<float> Vb, Mb;
      Vb.resize((size_t)(16 * c * nv + 16));
      Mb.resize((size_t)(16 * (o1 - o0) * nv + 16));
      float* V = Vb.data();
      float* M = Mb.data();
      const float* Xn = X + ni * c * h * w;
      for (int64_t ty = ty0; ty < ty1; ++ty)
        for (int64_t x = 0; x < ncol; x += 16)
          winograd_in(Xn, V, nv, ty, tx0 + x, std::min<int64_t>(16, ncol - x), (ty - ty0) * ncol + x);
      const int64_t mo = o1 - o0;
      for (int64_t p = 0; p < 16; ++p)
        for (int64_t q = 0; q < nv; q += 64) {
          const int64_t np = std::min<int64_t>(64, nv - q);
          for (int64_t kk = 0; kk < c; kk += korch_gemm::KC) {
            const int64_t kc = std::min(korch_gemm::KC, c - kk);
            for (int64_t pi = p0; pi < p1; ++pi) {
              const int64_t r0 = pi * MR, mr = std::min(MR, co - r0);
              korch_gemm::micro_a_wide(mr, np, kc, U + p * per + (pi * c + kk) * MR, V + (p * c + kk) * nv + q, nv,
                                       M + (p * mo + r0 - o0) * nv + q, nv, kk > 0);
            }
          }
        }
      for (int64_t o = o0; o < o1; ++o) {
        const __m512 b = _mm512_set1_ps(bias ? bias[o] : 0.0f);
        for (int64_t ty = ty0; ty < ty1; ++ty)
          for (int64_t x = 0; x < ncol; x += 16) {
            const int64_t nt = std::min<int64_t>(16, ncol - x);
            const float* m = M + (o - o0) * nv + (ty - ty0) * ncol + x;
            const int64_t ps = mo * nv;
            __m512 s[2][4];  // A^T m
            for (int k = 0; k < 4; ++k) {
              const __m512 m0 = _mm512_loadu_ps(m + (0 * 4 + k) * ps), m1 = _mm512_loadu_ps(m + (1 * 4 + k) * ps),
                           m2 = _mm512_loadu_ps(m + (2 * 4 + k) * ps), m3 = _mm512_loadu_ps(m + (3 * 4 + k) * ps);
              s[0][k] = _mm512_add_ps(_mm512_add_ps(m0, m1), m2);
              s[1][k] = _mm512_sub_ps(_mm512_sub_ps(m1, m2), m3);
            }
            const int64_t ox = 2 * (tx0 + x);
            const __mmask16 mlo = first_lanes(std::min(2 * nt, wo - ox)), mhi = first_lanes(std::min(2 * nt, wo - ox) - 16);
            for (int a = 0; a < 2; ++a) {
              const int64_t oy = 2 * ty + a;
              if (oy >= ho) break;
              __m512 y0 = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(s[a][0], s[a][1]), s[a][2]), b);
              __m512 y1 = _mm512_add_ps(_mm512_sub_ps(_mm512_sub_ps(s[a][1], s[a][2]), s[a][3]), b);
              // the columns in order, then the residual and the activation on them
              __m512 zlo = _mm512_permutex2var_ps(y0, lo_idx, y1), zhi = _mm512_permutex2var_ps(y0, hi_idx, y1);
              const int64_t at = (ni * co + o) * HW + oy * wo + ox;
              const auto add_sum = [&] {
                zlo = _mm512_add_ps(zlo, _mm512_maskz_loadu_ps(mlo, sum + at));
                if (mhi) zhi = _mm512_add_ps(zhi, _mm512_maskz_loadu_ps(mhi, sum + at + 16));
              };
              if (sum && !post.sum_after) add_sum();
              if (act) {
                zlo = korch_gemm::post_act16(post, zlo);
                if (mhi) zhi = korch_gemm::post_act16(post, zhi);
              }
              if (sum && post.sum_after) add_sum();
              _mm512_mask_storeu_ps(Y + at, mlo, zlo);
              if (mhi) _mm512_mask_storeu_ps(Y + at + 16, mhi, zhi);
            }
          }
        const int64_t oy0 = 2 * ty0, oy1 = std::min(ho, 2 * ty1);
        if (ncol == tw) {
          epilogue(Y, ptrs, (ni * co + o) * HW + oy0 * wo, (ni * co + o) * HW + oy1 * wo, post_steps);
        } else {
          const int64_t ox0 = 2 * tx0, ox1 = std::min(wo, 2 * (tx0 + ncol));
          for (int64_t oy = oy0; oy < oy1; ++oy)
            epilogue(Y, ptrs, (ni * co + o) * HW + oy * wo + ox0, (ni * co + o) * HW + oy * wo + ox1, post_steps);
        }
      }
    });
    return 0;
  }
#endif

  // whether 16-pixel vectors over HW pixels compute over 15% more than there are (49: 64)
  static bool vectors_waste(int64_t HW) { return (HW + 15) / 16 * 16 * 20 > HW * 23; }

  // Note [Pointwise convolution rows]
  // ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
  // A 1x1 convolution (unit strides, no padding) over NCHW is, per image and group,
  // Y[co, p] = W[co, :] @ X[:, p]. The general path computes out^T = X^T @ W^T with the
  // weights as korch_gemm's packed right operand. Its 6 x 16 tile is then 6 pixels by 16
  // channels, written back channel-major one element at a time: 96 scalar stores per
  // tile. At MobileNet's K = 16..96 a tile has only 6K FMAs, so the stores were a large
  // share. Here the weights are the left operand instead, packed once into 6-row panels,
  // and the right operand is the input read in place: 16 consecutive pixels of channel k
  // are two vector loads at X + k * HW + p. A tile is 6 channels by 16 pixels, stored as
  // 12 vector stores into the output's rows. The last pixels (HW mod 16) go through a
  // zero-padded copy. Tasks are blocks of pixels, and of channels when there are too few
  // pixel blocks for the threads.
  //
  // Note [Residual in registers]
  // ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
  // A ResNet bottleneck ends in a 1x1 conv, its bias, the block's input added, a ReLU.
  // The add over rows after the tile is stored read the tile back with the residual:
  // 64 -> 256 on 56 x 56 pixels cost 520 us with its bias, 650-666 with the add and ReLU
  // (two threads of an Intel Xeon). oneDNN's "sum" post-op instead: the epilogue's tensor
  // ADD whose operand is laid out as the output (its strides the output's) is loaded
  // beside the tile's own stores, after the bias and before the activation, or after
  // the activation where the chain adds it there (YOLOv5's bottleneck;
  // Post::sum_after). conv_pointwise's AVX-512 tiles and conv_winograd's output
  // transform do it (resnet18's 3x3 convs end its blocks): plan_post asks sum_path()
  // whether conv() will take one of them. sum_path() restates conv()'s order of tests
  // for those two paths; test_residual_in_registers holds the two together shape by shape.
  static constexpr int64_t PW_PIXELS = 256;  // pixels per task: a K x 256 block of X in L2

  int conv_pointwise(const float* X, const float* W, float* Y, void* const* ptrs, int T) const {
#if defined(__AVX2__) && defined(__FMA__)
    using korch_gemm::MR;
    using korch_gemm::NR;
    const int64_t cig = c / group, cog = co / group, HW = ho * wo, K = cig;
    const int64_t per = korch_gemm::packed_a_size(cog, K), tiles = (cog + MR - 1) / MR;
    const float* Ap;
    {
      std::lock_guard<std::mutex> lock(pack_mu);
      if (packed_from != W) {
        packed.assign((size_t)(per * group + 16), 0.0f);
        for (int64_t g = 0; g < group; ++g)
          korch_gemm::pack_a(W + g * cog * K, cog, K, K, 1, aligned_panels() + g * per);
        packed_from = W;
      }
      Ap = aligned_panels();
    }
    Ap = scale_panels(Ap, per, K, MR);  // Note [Scaled inputs]
    // Note [Balanced pixel blocks]: blocks of whole 64-pixel tiles, as equal as they can
    // be, and as many as the threads take in whole rounds: 28 x 28 pixels cut in 256s
    // were 256, 256, 256 and 16, one thread running two of the 256s (512 : 272)
    const int64_t vecs = (HW + 15) / 16;
    int64_t pblocks = (HW + PW_PIXELS - 1) / PW_PIXELS;
    if (n * group * pblocks >= T && (n * group * pblocks) % T && n * group * pblocks < 8 * T)
      pblocks += (T - (n * group * pblocks) % T + n * group - 1) / (n * group);
    pblocks = std::min(pblocks, vecs);
    // the first pixel of block pb: a multiple of 64 (of 16 where blocks are fewer than 4 vectors)
    const int64_t unit = vecs >= 4 * pblocks ? 4 : 1;
    const auto block_start = [=](int64_t pb) {
      return std::min(HW, (vecs * pb / pblocks + unit / 2) / unit * unit * 16);
    };
    int64_t cblocks = 1;
    if (n * group * pblocks < T) cblocks = std::min(tiles, (T + n * group * pblocks - 1) / (n * group * pblocks));
    const int64_t tiles_per = (tiles + cblocks - 1) / cblocks;
    cblocks = (tiles + tiles_per - 1) / tiles_per;
    std::vector<float> bias_buf;
    const korch_gemm::Post post = post_for(ptrs, bias_buf);
    // the tile of rows from r0 of group g: its Post (null: none, or not the last block of K)
    auto tile_post = [&](korch_gemm::Post& q, int64_t ni, int64_t g, int64_t r0, int64_t p,
                         bool last) -> const korch_gemm::Post* {
      if (!post_steps || !last) return nullptr;
      q = post;
      if (q.bias) q.bias += g * cog + r0;
      if (q.sum) q.sum += (ni * co + g * cog + r0) * HW + p;  // Note [Residual in registers]
      return &q;
    };
    parallel_for(n * group * pblocks * cblocks, T, [&](int64_t t) {
      korch_gemm::Post q;
      const int64_t cb = t % cblocks, pb = (t / cblocks) % pblocks, g = (t / (cblocks * pblocks)) % group,
                    ni = t / (cblocks * pblocks * group);
      const int64_t t0 = cb * tiles_per, t1 = std::min(tiles, t0 + tiles_per);
      const int64_t p0 = block_start(pb), p1 = pb + 1 == pblocks ? HW : block_start(pb + 1);
      const float* xg = X + (ni * c + g * cig) * HW;
      float* yg = Y + (ni * co + g * cog) * HW;
      const float* ag = Ap + g * per;
#if defined(__AVX512F__)
      // Note [Wide pointwise tiles]: 64 pixels a tile, the last ones masked
      for (int64_t p = p0; p < p1; p += 64) {
        const int64_t np = std::min<int64_t>(64, p1 - p);
        for (int64_t kk = 0; kk < K; kk += korch_gemm::KC) {
          const int64_t kc = std::min(korch_gemm::KC, K - kk);
          for (int64_t ti = t0; ti < t1; ++ti) {
            const int64_t r0 = ti * MR, mr = std::min(MR, cog - r0);
            korch_gemm::micro_a_wide(mr, np, kc, ag + (ti * K + kk) * MR, xg + kk * HW + p, HW, yg + r0 * HW + p, HW,
                                     kk > 0, tile_post(q, ni, g, r0, p, kk + kc == K));
          }
        }
      }
#else
      alignas(32) float tail_b[korch_gemm::KC * NR];
      alignas(32) float tail_c[MR * NR];
      for (int64_t p = p0; p < p1; p += NR) {
        const int64_t nn = std::min(NR, p1 - p);
        for (int64_t kk = 0; kk < K; kk += korch_gemm::KC) {
          const int64_t kc = std::min(korch_gemm::KC, K - kk);
          const float* B = xg + kk * HW + p;
          int64_t ldb = HW;
          if (nn < NR) {  // the last pixels, zero padded to a whole tile
            for (int64_t k = 0; k < kc; ++k) {
              std::memcpy(tail_b + k * NR, B + k * HW, sizeof(float) * nn);
              std::memset(tail_b + k * NR + nn, 0, sizeof(float) * (NR - nn));
            }
            B = tail_b, ldb = NR;
          }
          for (int64_t ti = t0; ti < t1; ++ti) {
            const int64_t r0 = ti * MR, mr = std::min(MR, cog - r0);
            const float* a = ag + (ti * K + kk) * MR;
            const korch_gemm::Post* tp = tile_post(q, ni, g, r0, p, kk + kc == K);
            if (nn == NR) {
              korch_gemm::micro_a(mr, kc, a, B, ldb, yg + r0 * HW + p, HW, kk > 0, tp);
            } else {
              korch_gemm::micro_a(mr, kc, a, B, ldb, tail_c, NR, false);
              for (int64_t i = 0; i < mr; ++i) {
                float* y = yg + (r0 + i) * HW + p;
                for (int64_t j = 0; j < nn; ++j) y[j] = kk ? y[j] + tail_c[i * NR + j] : tail_c[i * NR + j];
                if (tp)
                  for (int64_t j = 0; j < nn; ++j)
                    y[j] = korch_gemm::post_act1(*tp, tp->bias ? y[j] + tp->bias[i] : y[j]);
              }
            }
          }
        }
      }
#endif
      for (int64_t o = t0 * MR; o < std::min(cog, t1 * MR); ++o) {
        const int64_t base = (ni * co + g * cog + o) * HW;
        epilogue(Y, ptrs, base + p0, base + p1, post_steps);
      }
    });
    return 0;
#else
    return -1;  // korch_gemm::available is false: conv() does not come here
#endif
  }

  // a 1x1 conv at stride 2 or more that Note [Strided pointwise] gathers
  bool strided_pointwise() const {
    return kh == 1 && kw == 1 && pt == 0 && pl == 0 && (sh > 1 || sw > 1) && b_const && korch_gemm::available &&
           ho * wo >= korch_gemm::NR && !vectors_waste(ho * wo);
  }
  // a 1x1 conv at unit strides without padding: its output pixels are its input's
  bool unit_pointwise() const { return kh == 1 && kw == 1 && sh == 1 && sw == 1 && pt == 0 && pl == 0 && ho == h && wo == w; }

  // whether conv() runs this conv as conv_pointwise (Note [Residual in registers] asks when
  // the kernel is made); the order of conv()'s tests
  bool pointwise_path() const {
    if (op != 1 || pad_mode || (c / group == 1 && co / group == 1) || !b_const || !korch_gemm::available) return false;
#if defined(__AVX512F__)
    if (winograd() || row_conv()) return false;
#endif
    if (strided_pointwise()) return true;
    const int64_t HW = ho * wo;
    return unit_pointwise() && HW >= korch_gemm::NR && !(korch_gemm::wide && vectors_waste(HW));
  }

  // whether conv() runs this conv through a path that applies Post::sum
  bool sum_path() const {
#if defined(__AVX512F__)
    if (winograd()) return true;
#endif
    return pointwise_path();
  }

  int conv(void* const* ptrs) const {
    const float* X = static_cast<const float*>(ptrs[a]);
    const float* W = static_cast<const float*>(ptrs[b]);
    float* Y = static_cast<float*>(ptrs[nin + main]);
    const int64_t cig = c / group, cog = co / group, HW = ho * wo, KK = cig * kh * kw;
    // a depthwise FMA costs about four of a GEMM's (one load each, no reuse in registers),
    // so its work is counted four times against Note [Serial small kernels]' threshold:
    // MobileNetV3's 0.7-1.4 MFLOP depthwise convs ran serially at 100-200 us
    const double flops = 2.0 * n * co * HW * KK * (cig == 1 && cog == 1 ? 4 : 1);
    const int T = flops < SERIAL_FLOPS && 4.0 * co * KK < SERIAL_WEIGHT_BYTES ? 1 : threads();
#if defined(__AVX512F__)
    if (winograd()) return conv_winograd(X, W, Y, ptrs, T);  // Note [Winograd convolution]
#endif
    if (pad_mode) {  // Note [Reflected padding]: the direct conv's padded copy only
      if (!korch_gemm::available) {
        korch_set_error("conv: reflected or edge padding needs the direct convolution (AVX2 and FMA)");
        return -1;
      }
      return conv_direct(X, panels_b(W), Y, ptrs, T);
    }
#if defined(__AVX512F__)
    if (row_conv()) {  // Note [Row convolution]
      const float* Wr = pack_row_conv(W);
      const int64_t nb = (cog + RC_CB - 1) / RC_CB, outer = n * group * nb;
      const int64_t bands = std::min<int64_t>(ho, (4 * T + outer - 1) / outer), rows = (ho + bands - 1) / bands;
      std::vector<float> bias_buf;
      korch_gemm::Post post = post_for(ptrs, bias_buf);
      const float* bias = post_steps ? post.bias : nullptr;
      post.bias = nullptr;
      parallel_for(outer * bands, T, [&](int64_t t) {
        const int64_t band = t % bands, blk = (t / bands) % nb, g = (t / (bands * nb)) % group,
                      ni = t / (bands * nb * group);
        const int64_t oy0 = band * rows, oy1 = std::min(ho, oy0 + rows);
        if (oy0 >= oy1) return;
        const int64_t o0 = g * cog + blk * RC_CB, nc = std::min(RC_CB, cog - blk * RC_CB);
        alignas(64) float bb[RC_CB] = {};  // the block's bias, zero past cog
        for (int64_t j = 0; bias && j < nc; ++j) bb[j] = bias[o0 + j];
        const korch_gemm::Post* q = post_steps ? &post : nullptr;
        if (sw == 1) row_conv_band<1>(X, Wr, Y, ni, g, blk, oy0, oy1, bb, q);
        else row_conv_band<2>(X, Wr, Y, ni, g, blk, oy0, oy1, bb, q);
        for (int64_t j = 0; j < nc; ++j)
          epilogue(Y, ptrs, (ni * co + o0 + j) * HW + oy0 * wo, (ni * co + o0 + j) * HW + oy1 * wo, post_steps);
      });
      return 0;
    }
    if (cig == 1 && cog == 1 && row_depthwise()) {  // Note [Row depthwise]
      // bands only where the planes are too few to share out; one a plane where it pools
      const int64_t bands = pools ? 1 : std::min<int64_t>(ho, (8 * T + n * co - 1) / (n * co));
      const int64_t rows = (ho + bands - 1) / bands;
      std::vector<float> bias_buf;
      korch_gemm::Post post = post_for(ptrs, bias_buf);
      const float* bias = post_steps ? post.bias : nullptr;
      post.bias = nullptr;
      parallel_for(n * co * bands, T, [&](int64_t t) {
        const int64_t band = t % bands, ch = (t / bands) % co, ni = t / (bands * co);
        const int64_t oy0 = band * rows, oy1 = std::min(ho, oy0 + rows);
        if (oy0 >= oy1) return;
        depthwise_rows(X, W, Y, ni, ch, oy0, oy1, bias ? bias[ch] : 0.0f, post_steps ? &post : nullptr);
        epilogue(Y, ptrs, (ni * co + ch) * HW + oy0 * wo, (ni * co + ch) * HW + oy1 * wo, post_steps);
      });
      return 0;
    }
#endif
    if (cig == 1 && cog == 1 && blocked_depthwise()) {  // Note [Channel-blocked depthwise]
#if defined(__AVX2__) && defined(__FMA__)
      // channels a block: sixteen with AVX-512 (Note [Channel-blocked depthwise] on
      // sixteen channels), else eight
#if defined(__AVX512F__)
      const float* Wb = pack_depthwise16(W);
      constexpr int64_t DL = 16;
#else
      const float* Wb = pack_depthwise(W);
      constexpr int64_t DL = 8;
#endif
      // Note [Pooled taps]: one task a plane where the kernel pools, so that its sums
      // add up in one order
      const int64_t cb = (co + DL - 1) / DL, rows = pools ? ho : dw_band_rows(), bands = (ho + rows - 1) / rows;
      std::vector<float> bias_buf;
      const korch_gemm::Post post = post_for(ptrs, bias_buf);
      parallel_for(n * cb * bands, T, [&](int64_t t) {
        const int64_t band = t % bands, blk = (t / bands) % cb, ni = t / (bands * cb);
        const int64_t oy0 = band * rows, oy1 = std::min(ho, oy0 + rows), c0 = blk * DL;
        // Note [Register post-ops]: the block's channels of bias, zero past co
        alignas(64) float bb[16] = {};
        korch_gemm::Post q = post;
        if (post.bias) {
          for (int64_t j = 0; j < std::min<int64_t>(DL, co - c0); ++j) bb[j] = post.bias[c0 + j];
          q.bias = bb;
        }
#if defined(__AVX512F__)
        depthwise_blocked16(X, Wb, Y, ni, c0, oy0, oy1, post_steps ? &q : nullptr);
#else
        depthwise_blocked(X, Wb, Y, ni, c0, oy0, oy1, post_steps ? &q : nullptr);
#endif
        for (int64_t ch = c0; ch < std::min(co, c0 + DL); ++ch)
          epilogue(Y, ptrs, (ni * co + ch) * HW + oy0 * wo, (ni * co + ch) * HW + oy1 * wo, post_steps);
      });
      return 0;
#endif
    }
    if (cig == 1 && cog == 1) {
      const int64_t tasks = n * co;
      parallel_for(tasks, T, [&](int64_t t) {
        depthwise_channel(X, W, Y, t / co, t % co);
        epilogue(Y, ptrs, t * HW, (t + 1) * HW);
      });
      return 0;
    }
    // Note [Strided pointwise]: a 1x1 conv at stride 2 (a ResNet's projection) reads a
    // quarter of its input. As the direct conv it ran at about 150 GFLOP/s (256 -> 512
    // from 56 x 56: 1376 us alone, onnxruntime 1337); the pixels it reads, gathered into
    // a contiguous copy, make it a pointwise conv (Note [Pointwise convolution rows])
    if (strided_pointwise()) {
      gathered.resize((size_t)(n * c * HW + 16));
      float* Xs = align64(gathered.data());
      const int64_t planes = n * c, parts = std::min<int64_t>(planes, 4 * T);
      parallel_for(parts, T, [&](int64_t part) {
        for (int64_t q = planes * part / parts; q < planes * (part + 1) / parts; ++q) {
          const float* src = X + q * h * w;
          float* dst = Xs + q * HW;
          for (int64_t oy = 0; oy < ho; ++oy)
            for (int64_t ox = 0; ox < wo; ++ox) dst[oy * wo + ox] = src[oy * sh * w + ox * sw];
        }
      });
      return conv_pointwise(Xs, W, Y, ptrs, T);
    }
    const bool direct = unit_pointwise();
    if (direct && korch_gemm::available && b_const && HW < korch_gemm::NR) return conv_few_pixels(X, W, Y, ptrs, T);
    // Note [Wide pointwise tiles]: where 16-pixel vectors would compute over 15% more
    // pixels than there are (49: 64), the direct conv's pixel rows instead
    if (direct && korch_gemm::wide && b_const && vectors_waste(HW))
      return conv_direct(X, panels_b(W), Y, ptrs, T, /*flat=*/true);
    if (direct && korch_gemm::available && b_const) return conv_pointwise(X, W, Y, ptrs, T);
    if (!direct && korch_gemm::available && b_const)
      return conv_direct(X, panels_b(W), Y, ptrs, T);
    // blocks of whole output rows (columns of the GEMM); an im2col block stays within
    // ~512 KB; at least one block per thread
    int64_t rows_per = direct ? ho : std::max<int64_t>(1, (131072 / std::max<int64_t>(1, KK)) / wo);
    rows_per = std::min(rows_per, ho);
    int64_t blocks = (ho + rows_per - 1) / rows_per;
    if (n * group * blocks < T) blocks = std::min<int64_t>(ho, (T + n * group - 1) / (n * group));
    rows_per = (ho + blocks - 1) / blocks;
    blocks = (ho + rows_per - 1) / rows_per;
    const int64_t chunk = rows_per * wo;
    const int64_t tasks = n * group * blocks;
    int err = 0;
    // weights as the packed operand: out^T[pixels, Co] = im2col^T @ W^T, written channel-major
    const bool use_packed = korch_gemm::available && b_const;
    const int64_t per = korch_gemm::packed_size(KK, cog), panels = (cog + korch_gemm::NR - 1) / korch_gemm::NR;
    const float* Wp = use_packed ? pack(W, group, cog * KK, KK, cog, 1, KK) : nullptr;
    {
      parallel_for(tasks, T, [&](int64_t t) {
        // each thread's im2col block, kept between calls
        static thread_local std::vector<float> col;
        if (!direct && col.size() < (size_t)(KK * chunk)) col.resize((size_t)(KK * chunk));
        const int64_t ni = t / (group * blocks), g = (t / blocks) % group, blk = t % blocks;
        const int64_t oy0 = blk * rows_per, oy1 = std::min(ho, oy0 + rows_per);
        const int64_t p0 = oy0 * wo, p1 = oy1 * wo, np = p1 - p0;
        const float* xg = X + (ni * c + g * cig) * h * w;
        const float* wg = W + g * cog * KK;
        float* yg = Y + (ni * co + g * cog) * HW;
        const float* Bm;
        int64_t ldb;
        if (direct) {
          Bm = xg + p0;
          ldb = HW;
        } else {
          for (int64_t ci = 0; ci < cig; ++ci)
            for (int64_t ky = 0; ky < kh; ++ky)
              for (int64_t kx = 0; kx < kw; ++kx) {
                float* dst = col.data() + ((ci * kh + ky) * kw + kx) * np;
                const float* src = xg + ci * h * w;
                const int64_t shift = kx * dw - pl;  // ix = ox * sw + shift
                const int64_t lo = std::min(wo, shift >= 0 ? 0 : (-shift + sw - 1) / sw);
                const int64_t hi = std::max(lo, std::min(wo, (w - 1 - shift) >= 0 ? (w - 1 - shift) / sw + 1 : 0));
                for (int64_t oy = oy0; oy < oy1; ++oy, dst += wo) {
                  const int64_t iy = oy * sh - pt + ky * dh;
                  if (iy < 0 || iy >= h) {
                    std::memset(dst, 0, sizeof(float) * wo);
                    continue;
                  }
                  const float* xr = src + iy * w + shift;
                  for (int64_t ox = 0; ox < lo; ++ox) dst[ox] = 0.0f;
                  if (sw == 1) {
                    std::memcpy(dst + lo, xr + lo, sizeof(float) * (hi - lo));
                  } else {
                    for (int64_t ox = lo; ox < hi; ++ox) dst[ox] = xr[ox * sw];
                  }
                  for (int64_t ox = hi; ox < wo; ++ox) dst[ox] = 0.0f;
                }
              }
          Bm = col.data();
          ldb = np;
        }
        if (use_packed)
          korch_gemm::gemm(cog, KK, Bm, 1, ldb, Wp + g * per, yg + p0, 1, HW, 0, np, 0, panels);
        else
          scipy_cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)cog, (int)np, (int)KK, 1.0f, wg,
                            (int)KK, Bm, (int)ldb, 0.0f, yg + p0, (int)HW);
        for (int64_t o = 0; o < cog; ++o) {
          const int64_t base = (ni * co + g * cog + o) * HW;
          epilogue(Y, ptrs, base + p0, base + p1);
        }
      });
    }
    return err;
  }
};

struct Reader {
  const int64_t* p;
  int64_t n, i = 0;
  bool ok = true;
  int64_t next() {
    if (i >= n) {
      ok = false;
      return 0;
    }
    return p[i++];
  }
  double next_double() {  // a float64's bits (a scalar step's operand, a pool's divisor)
    const int64_t bits = next();
    double v;
    std::memcpy(&v, &bits, sizeof v);
    return v;
  }
};

}  // namespace

extern "C" {

void korch_set_error(const char* msg) {
  std::lock_guard<std::mutex> lock(g_err_mu);
  g_err = msg ? msg : "";
}

const char* korch_last_error() { return g_err.c_str(); }

void korch_set_threads(int n) {
  g_threads = n > 0 ? n : 0;
  scipy_openblas_set_num_threads(1);  // the pool is ours: BLAS runs inside its tasks
}

int korch_get_threads() { return threads(); }

int korch_wide_tiles() { return korch_gemm::wide ? 1 : 0; }

void* korch_aligned_alloc(int64_t nbytes) {
  const int64_t size = (std::max<int64_t>(nbytes, 1) + 63) / 64 * 64;
  return std::aligned_alloc(64, (size_t)size);
}

void korch_aligned_free(void* p) { std::free(p); }

void* korch_linear_create(const int64_t* code, int64_t n) {
  Reader r{code, n};
  auto* k = new Linear();
  const int64_t version = r.next();
  k->op = r.next();
  k->nin = r.next();
  k->nout = r.next();
  k->main = r.next();
  k->b_const = r.next();
  k->a = r.next();
  k->b = r.next();
  const int64_t D = r.next();
  for (int64_t d = 0; d < D && r.ok; ++d) k->oshape.push_back(r.next());
  if (k->op == 0) {
    k->batch = r.next();
    k->M = r.next();
    k->K = r.next();
    k->N = r.next();
    for (int64_t i = 0; i < k->batch && r.ok; ++i) k->aoff.push_back(r.next());
    for (int64_t i = 0; i < k->batch && r.ok; ++i) k->boff.push_back(r.next());
  } else if (k->op == 2) {
    int64_t* f[] = {&k->tk_outer, &k->tk_len, &k->tk_inner, &k->tk_k, &k->tk_largest};
    for (int64_t* x : f) *x = r.next();
    for (int64_t j = 0; j < k->nout && r.ok; ++j) k->tk_which.push_back(r.next());
    for (int64_t w : k->tk_which)
      if (w != 0 && w != 1) r.ok = false;
    if (k->tk_k < 1 || k->tk_k > k->tk_len || k->tk_outer < 1 || k->tk_inner < 1) r.ok = false;
  } else if (k->op == 4) {  // Note [Native softmax]
    k->sm_rows = r.next();
    k->sm_len = r.next();
    k->sm_norm = r.next();
    if (k->sm_rows < 1 || k->sm_len < 1 || k->nout != 1) r.ok = false;
  } else if (k->op == 7) {  // Note [Native LayerNorm]
    k->ln_rows = r.next();
    k->ln_len = r.next();
    k->ln_eps = (float)r.next_double();
    k->ln_gamma = r.next();
    k->ln_beta = r.next();
    if (k->ln_rows < 1 || k->ln_len < 1 || k->nout != 1 || k->ln_gamma < -1 || k->ln_gamma >= k->nin ||
        k->ln_beta < -1 || k->ln_beta >= k->nin || k->a < 0 || k->a >= k->nin)
      r.ok = false;
  } else if (k->op == 5) {  // Note [Native transpose]
    int64_t* f[] = {&k->tp_b, &k->tp_m, &k->tp_n, &k->tp_c};
    for (int64_t* x : f) *x = r.next();
    if (k->tp_b < 1 || k->tp_m < 1 || k->tp_n < 1 || k->tp_c < 1 || k->nout != 1) r.ok = false;
  } else if (k->op == 6) {  // Note [Native strided copies]
    for (int64_t j = 0; j < k->nout && r.ok; ++j) {
      Linear::CopyOut c;
      const int64_t Dj = r.next();
      if (Dj < 0 || Dj > 16) r.ok = false;
      for (int64_t d = 0; d < Dj && r.ok; ++d) c.shape.push_back(r.next());
      c.offset = r.next();
      for (int64_t d = 0; d < Dj && r.ok; ++d) c.strides.push_back(r.next());
      c.size = 1;
      for (int64_t e : c.shape) c.size *= e;
      const int64_t ns = r.next();
      for (int64_t q = 0; q < ns && r.ok; ++q) {
        Step st;
        st.op = r.next();
        st.left = r.next();
        st.scalar = (float)r.next_double();
        st.kind = st.op >= NEG ? 0 : 1;
        st.pos = -1;
        if (st.op < ADD || (st.op > MIN && st.op < NEG) || st.op > ERF) r.ok = false;
        c.steps.push_back(st);
      }
      if (c.offset < 0) r.ok = false;
      k->copies.push_back(std::move(c));
    }
    if (k->nout < 1) r.ok = false;
  } else if (k->op == 3) {  // Note [Native pooling]
    int64_t* f[] = {&k->n, &k->c, &k->h,  &k->w,  &k->kh, &k->kw, &k->sh,
                    &k->sw, &k->dh, &k->dw, &k->pt, &k->pl, &k->ho, &k->wo, &k->pool_max};
    for (int64_t* x : f) *x = r.next();
    const double v = r.next_double();
    k->pool_div = (float)v;
    if (k->kh < 1 || k->kw < 1 || k->sh < 1 || k->sw < 1 || k->dh < 1 || k->dw < 1 || k->ho < 1 || k->wo < 1 ||
        k->nout != 1 || !(v != 0.0))
      r.ok = false;
  } else {
    int64_t* f[] = {&k->n, &k->c, &k->h, &k->w, &k->co, &k->kh, &k->kw, &k->sh,
                    &k->sw, &k->dh, &k->dw, &k->pt, &k->pl, &k->group, &k->ho, &k->wo};
    for (int64_t* x : f) *x = r.next();
    if (version >= 2) k->pad_mode = r.next();  // version 1 (executables saved before it): zeros
    // Note [Reflected padding]: through the direct conv (its weights packed once); a
    // reflection within the input (mirrored() clamps what it reads in any case)
    if (k->pad_mode < 0 || k->pad_mode > 2 || (k->pad_mode && !k->b_const) ||
        (k->pad_mode == 1 && (k->pt >= k->h || k->pl >= k->w)))
      r.ok = false;
  }
  const int64_t steps = r.next();
  for (int64_t s = 0; s < steps && r.ok; ++s) {
    Step st;
    st.op = r.next();
    st.kind = r.next();
    st.left = r.next();
    st.pos = r.next();
    st.scalar = (float)r.next_double();
    for (int64_t d = 0; d < D && r.ok; ++d) st.strides.push_back(r.next());
    if ((st.kind == 3 && (st.pos < 0 || st.pos >= k->nout)) || (st.kind == 2 && (st.pos < 0 || st.pos >= k->nin)) ||
        (st.kind == 4 && (st.pos < 0 || st.pos > k->slots)) || (st.kind == 5 && (st.pos < 0 || st.pos >= k->slots)) ||
        (st.kind == 6 && (st.pos < 0 || st.pos >= k->nout || st.pos == k->main || k->op != 1 || D != 4 || st.scalar == 0.0f ||
                          k->group != k->c || k->co != k->c)) ||
        (st.kind == 7 && (st.pos < 0 || st.pos >= k->nin || k->op != 1 || D != 4 || st.strides[2] || st.strides[3])) ||
        (st.kind == 8 && (k->a_scale < 0 || (st.pos != 0 && st.pos != 1))) || st.kind < 0 || st.kind > 8)
      r.ok = false;
    if (r.ok && st.kind == 8) {  // Note [Scaled inputs]: made before it scales
      k->scale_chain.push_back(st);
      continue;
    }
    if (r.ok && st.kind == 7) {  // Note [Scaled inputs]: not a step of the epilogue
      k->a_scale = st.pos, k->as_n = st.strides[0], k->as_c = st.strides[1];
      continue;
    }
    k->pools |= st.kind == 6;
    if (st.kind == 4 && st.pos == k->slots) ++k->slots;  // slots are saved in order before they are read
    k->epi.push_back(st);
  }
  if (!r.ok || version < 1 || version > 2 || r.i != n || D < 1 || k->op < 0 || k->op > 7 || (k->op >= 2 && ((k->nout > 2 && k->op != 6) || !k->epi.empty())) || k->main < 0 || k->main > k->nout || (k->main == k->nout && !k->pools) ||
      (k->op == 1 && (k->group < 1 || k->c % k->group || k->co % k->group))) {
    korch_set_error("korch_linear_create: malformed kernel code");
    delete k;
    return nullptr;
  }
  k->plan_rows();
  k->plan_post();
  if (k->op == 6) k->plan_copies();
  if (g_threads == 0) scipy_openblas_set_num_threads(1);
  return k;
}

int korch_linear_run(void* handle, void* const* ptrs) { return static_cast<Linear*>(handle)->run(ptrs); }

void korch_linear_free(void* handle) { delete static_cast<Linear*>(handle); }

int64_t korch_linear_post_steps(void* handle) { return (int64_t) static_cast<Linear*>(handle)->post_steps; }

// TVM's parallel ABI: f(task_id, TVMParallelGroupEnv*, cdata); env = {sync_handle, num_task}
struct GroupEnv {
  void* sync_handle;
  int32_t num_task;
};

void korch_serial(int on) { g_serial = on; }

int korch_parallel_launch(int (*f)(int, void*, void*), void* cdata, int num_task) {
  const int T = g_serial ? 1 : num_task > 0 ? num_task : threads();
  if (T == 1) {
    GroupEnv env{nullptr, 1};
    return f(0, &env, cdata);
  }
  struct Launch {
    int (*f)(int, void*, void*);
    void* cdata;
    GroupEnv env;
    std::atomic<int> rc;
  } job{f, cdata, GroupEnv{nullptr, (int32_t)T}, {0}};
  pool().run(
      [](void* c, int64_t t) {
        auto* j = static_cast<Launch*>(c);
        const int r = j->f((int)t, &j->env, j->cdata);
        if (r != 0) j->rc.store(r, std::memory_order_relaxed);
      },
      &job, T, T);
  return job.rc.load();
}

void* korch_workspace_alloc(int, int, uint64_t nbytes, int, int) { return korch_aligned_alloc((int64_t)nbytes); }

int korch_workspace_free(int, int, void* ptr) {
  korch_aligned_free(ptr);
  return 0;
}

void korch_pool_hold(int on) { pool().hold(on); }

int korch_pool_holds() { return pool().holds(); }

}  // extern "C"

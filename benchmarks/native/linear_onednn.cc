// oneDNN (3.x C++ API) harness for benchmarks/linear_libraries.py, loaded with ctypes.
// Weights are given plain, reordered once into the primitive's preferred ('any')
// layout; activations stay plain (row-major MxK / NCHW or NHWC) because that is what
// neighbouring kernels of a korch executable would read and write.
// Optional fused epilogue: binary add of a residual (dst-shaped) then eltwise ReLU.
#include <oneapi/dnnl/dnnl.hpp>
#include <omp.h>
#include <chrono>
#include <cstring>
#include <string>
#include <unordered_map>

using namespace dnnl;
using tag = memory::format_tag;
using dt = memory::data_type;

namespace {
struct Handle {
  engine eng{engine::kind::cpu, 0};
  stream strm{eng};
  primitive prim;
  memory src, dst, wei, bias, res;
  bool has_bias = false, fused = false;
  std::string impl;
};

primitive_attr make_attr(bool fused, const memory::desc& dst_md) {
  primitive_attr attr;
  if (fused) {
    post_ops po;
    po.append_binary(algorithm::binary_add, dst_md);
    po.append_eltwise(algorithm::eltwise_relu, 0.f, 0.f);
    attr.set_post_ops(po);
  }
  return attr;
}

void reorder_weights(Handle* h, const memory::desc& user_md, const memory::desc& want,
                     const float* w) {
  memory user(user_md, h->eng, const_cast<float*>(w));
  h->wei = memory(want, h->eng);
  reorder(user, h->wei).execute(h->strm, user, h->wei);
  h->strm.wait();
}
}  // namespace

extern "C" {

void* onednn_matmul_create(int M, int K, int N, const float* w, const float* b, int fused,
                           int threads) {
  omp_set_num_threads(threads);
  auto* h = new Handle;
  memory::desc src_md({M, K}, dt::f32, tag::ab), dst_md({M, N}, dt::f32, tag::ab);
  memory::desc any_w({K, N}, dt::f32, tag::any), bias_md({1, N}, dt::f32, tag::ab);
  h->has_bias = b != nullptr;
  h->fused = fused != 0;
  auto attr = make_attr(h->fused, dst_md);
  auto pd = h->has_bias ? matmul::primitive_desc(h->eng, src_md, any_w, bias_md, dst_md, attr)
                        : matmul::primitive_desc(h->eng, src_md, any_w, dst_md, attr);
  reorder_weights(h, memory::desc({K, N}, dt::f32, tag::ab), pd.weights_desc(), w);
  if (h->has_bias) h->bias = memory(bias_md, h->eng, const_cast<float*>(b));
  h->src = memory(src_md, h->eng, DNNL_MEMORY_NONE);
  h->dst = memory(dst_md, h->eng, DNNL_MEMORY_NONE);
  h->res = memory(dst_md, h->eng, DNNL_MEMORY_NONE);
  h->impl = pd.impl_info_str();
  h->prim = matmul(pd);
  return h;
}

void* onednn_conv_create(int N, int C, int H, int W, int O, int kh, int kw, int sh, int sw,
                         int ph, int pw, int group, int OH, int OW, const float* w,
                         const float* b, int fused, int nhwc, int threads) {
  omp_set_num_threads(threads);
  auto* h = new Handle;
  tag act = nhwc ? tag::nhwc : tag::nchw;
  memory::desc src_md({N, C, H, W}, dt::f32, act), dst_md({N, O, OH, OW}, dt::f32, act);
  memory::dims wdims = group > 1 ? memory::dims{group, O / group, C / group, kh, kw}
                                 : memory::dims{O, C, kh, kw};
  tag wtag = group > 1 ? tag::goihw : tag::oihw;
  memory::desc any_w(wdims, dt::f32, tag::any), bias_md({O}, dt::f32, tag::a);
  h->has_bias = b != nullptr;
  h->fused = fused != 0;
  auto attr = make_attr(h->fused, dst_md);
  memory::dims strides{sh, sw}, pads{ph, pw};
  auto pd = h->has_bias
                ? convolution_forward::primitive_desc(
                      h->eng, prop_kind::forward_inference, algorithm::convolution_direct,
                      src_md, any_w, bias_md, dst_md, strides, pads, pads, attr)
                : convolution_forward::primitive_desc(
                      h->eng, prop_kind::forward_inference, algorithm::convolution_direct,
                      src_md, any_w, dst_md, strides, pads, pads, attr);
  reorder_weights(h, memory::desc(wdims, dt::f32, wtag), pd.weights_desc(), w);
  if (h->has_bias) h->bias = memory(bias_md, h->eng, const_cast<float*>(b));
  h->src = memory(pd.src_desc(), h->eng, DNNL_MEMORY_NONE);
  h->dst = memory(pd.dst_desc(), h->eng, DNNL_MEMORY_NONE);
  h->res = memory(dst_md, h->eng, DNNL_MEMORY_NONE);
  h->impl = pd.impl_info_str();
  h->prim = convolution_forward(pd);
  return h;
}

const char* onednn_impl(void* p) { return static_cast<Handle*>(p)->impl.c_str(); }

// Runs the primitive n times; per-call wall times (ns) go to ns_out.
void onednn_run(void* p, const float* src, const float* res, float* dst, int n, double* ns_out) {
  auto* h = static_cast<Handle*>(p);
  h->src.set_data_handle(const_cast<float*>(src));
  h->dst.set_data_handle(dst);
  std::unordered_map<int, memory> args{
      {DNNL_ARG_SRC, h->src}, {DNNL_ARG_WEIGHTS, h->wei}, {DNNL_ARG_DST, h->dst}};
  if (h->has_bias) args[DNNL_ARG_BIAS] = h->bias;
  if (h->fused) {
    h->res.set_data_handle(const_cast<float*>(res));
    args[DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1] = h->res;
  }
  for (int i = 0; i < n; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    h->prim.execute(h->strm, args);
    h->strm.wait();
    ns_out[i] = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
  }
}

void onednn_destroy(void* p) { delete static_cast<Handle*>(p); }
}

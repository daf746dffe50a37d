// Decode attention over a heads-first cache, called from JAX through the XLA FFI.
//
//   out[b, t, h, :] = softmax_k(q[b, t, h, :] . k[b, h, :, k] + bias[b, h, t, k]) @ v[b, h, :, k]
//
// over the keys k < num_keys[b] (clamped to [1, K]): the caller's bias masks every later key for
// every query of row b (a decode step's cache beyond its last new token), so their softmax weight is
// exactly 0 and skipping them gives the same bits as attending over all K, at the cost of the keys
// that exist so far instead of the whole cache.
//
// q [B, T, H, dh]; k, v [B, H, dh, K] (the decoding cache's layout); bias [B|1, H|1, T|1, K] (mask
// and relative positions; broadcast dims have size 1); num_keys [B] int32; out [B, T, H, dh]; the
// rest float32. Every
// (b, t, h) row is computed alone in a fixed order (attention_impl.inc), so a T-token call gives
// each row the bits T one-token calls give it, on every ISA path:
//   scores: one FMA chain per key over dh in order d = 0..dh-1, then + bias;
//   softmax: max, exp (exp_nonpositive), a 16-lane sum and a fixed tree, one division per key;
//   output: per d, a 16-lane FMA reduction over the keys and the same tree.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "vec16.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;
using Rank4 = ffi::Buffer<ffi::F32, 4>;  // aliases: the handler macro below splits at commas
using Rank1I32 = ffi::Buffer<ffi::S32, 1>;

namespace {

struct Dims {
  int64_t b, t, h, dh, k;
  int64_t bias_b, bias_h, bias_t;  // bias strides (0 on broadcast dims)
};

#define SPEC_KERNEL_BODY "attention_impl.inc"
#include "per_isa.inc"

ffi::Error DecodeAttention(Rank4 q, Rank4 k, Rank4 v, Rank4 bias,
                           Rank1I32 num_keys, ffi::Result<Rank4> out, int64_t isa) {
  const auto qd = q.dimensions(), kd = k.dimensions(), vd = v.dimensions(), bd = bias.dimensions();
  Dims d{qd[0], qd[1], qd[2], qd[3], kd[3], 0, 0, 0};
  const bool kv_ok = kd[0] == d.b && kd[1] == d.h && kd[2] == d.dh &&
                     std::equal(kd.begin(), kd.end(), vd.begin());
  const bool bias_ok = (bd[0] == 1 || bd[0] == d.b) && (bd[1] == 1 || bd[1] == d.h) &&
                       (bd[2] == 1 || bd[2] == d.t) && bd[3] == d.k;
  if (!kv_ok || !bias_ok || num_keys.dimensions()[0] != d.b)
    return ffi::Error::InvalidArgument(
        "decode_attention: shapes must be q [B,T,H,dh], k/v [B,H,dh,K], bias [B|1,H|1,T|1,K], "
        "num_keys [B]");
  if (d.k == 0) return ffi::Error::InvalidArgument("decode_attention: no keys (K = 0)");
  d.bias_t = bd[2] == 1 ? 0 : d.k;
  d.bias_h = bd[1] == 1 ? 0 : bd[2] * d.k;
  d.bias_b = bd[0] == 1 ? 0 : bd[1] * bd[2] * d.k;
  if (isa == 0) isa = spec::best_isa();
  if (isa > spec::best_isa())
    return ffi::Error::InvalidArgument(
        "decode_attention: this CPU does not support the ISA asked for");
  std::vector<float> scores(d.t * d.k);
  auto* body = isa == 3 ? avx512::attention_body
               : isa == 2 ? avx2::attention_body
                          : portable::attention_body;
  body(q.typed_data(), k.typed_data(), v.typed_data(), bias.typed_data(), num_keys.typed_data(),
       out->typed_data(), d, scores.data());
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(SpeculativeDecodeAttention, DecodeAttention,
                              ffi::Ffi::Bind()
                                  .Arg<Rank4>()
                                  .Arg<Rank4>()
                                  .Arg<Rank4>()
                                  .Arg<Rank4>()
                                  .Arg<Rank1I32>()
                                  .Ret<Rank4>()
                                  .Attr<int64_t>("isa"));

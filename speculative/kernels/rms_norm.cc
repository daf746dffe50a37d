// T5's RMS layer norm of each row, called from JAX through the XLA FFI:
//
//   y[r, :] = (x[r, :] * (1 / sqrt(sum(x[r, :]^2) / d + eps))) * scale
//
// x [..., d] float32 (all leading dims are rows), scale [d] float32, y like x. The sum of squares
// is a 16-lane FMA reduction with a fixed tree (rms_norm_impl.inc), so a row's result does not
// depend on how many rows the call has or on the ISA path.

#include <cmath>
#include <cstdint>

#include "vec16.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;
using Rank1 = ffi::Buffer<ffi::F32, 1>;  // an alias: the handler macro below splits at commas

namespace {

#define SPEC_KERNEL_BODY "rms_norm_impl.inc"
#include "per_isa.inc"

ffi::Error RmsNorm(ffi::Buffer<ffi::F32> x, Rank1 scale, ffi::Result<ffi::Buffer<ffi::F32>> y,
                   float eps, int64_t isa) {
  const auto xd = x.dimensions();
  if (xd.size() < 1 || xd.back() != scale.dimensions()[0])
    return ffi::Error::InvalidArgument("rms_norm: x must be [..., d] and scale [d]");
  const int64_t d = xd.back();
  if (isa == 0) isa = spec::best_isa();
  if (isa > spec::best_isa())
    return ffi::Error::InvalidArgument("rms_norm: this CPU does not support the ISA asked for");
  if (d == 0) return ffi::Error::Success();
  auto* body = isa == 3 ? avx512::rms_norm_body
               : isa == 2 ? avx2::rms_norm_body
                          : portable::rms_norm_body;
  body(x.typed_data(), scale.typed_data(), y->typed_data(),
       static_cast<int64_t>(x.element_count()) / d, d, eps);
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(SpeculativeRmsNorm, RmsNorm,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<Rank1>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<float>("eps")
                                  .Attr<int64_t>("isa"));

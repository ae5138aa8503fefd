// Tests for src/core/tensor_view.h (Note [typed views]) and the store handing units out as typed
// views: a bf16 unit is never readable as float*, slices land on the right element.
#include "core/tensor_view.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "model/model_config.h"
#include "model/param_layout.h"
#include "store/segment_store.h"
#include "stratum/error.h"

namespace stratum {
namespace {

TEST(TensorView, TypedAccessChecksTheTypeAndSlicesCountElements) {
  std::vector<std::uint16_t> halves(10);
  const TensorView v(halves.data(), DType::BF16, halves.size());
  EXPECT_EQ(v.size_bytes(), 20u);
  EXPECT_EQ(v.bf16(), halves.data());
  EXPECT_THROW(v.f32(), BugError);
  const TensorView s = v.slice(3, 4);
  EXPECT_EQ(s.bf16(), halves.data() + 3);
  EXPECT_EQ(s.elements(), 4u);
  EXPECT_THROW(v.slice(8, 3), BugError);
  std::vector<float> floats(6);
  const TensorView f = TensorView::of(floats.data(), floats.size());
  EXPECT_EQ(f.slice(2, 4).f32(), floats.data() + 2);
  EXPECT_THROW(f.bf16(), BugError);
  const TensorView device(floats.data(), DType::F32, floats.size(), MemoryKind::Device);
  EXPECT_THROW(device.f32(), BugError) << "device memory is not host memory";
}

TEST(TensorView, StoreHandsBf16ParamsOutOnlyAsBf16) {
  GptConfig cfg;
  cfg.arch = ModelArch::Llama;
  cfg.n_layer = 1;
  cfg.n_head = 2;
  cfg.n_embd = 16;
  cfg.n_ctx = 8;
  cfg.vocab_size = 32;
  cfg.n_inner = 32;
  const ParamLayout layout = ParamLayout::of(cfg);
  RamSegmentStore store(UnitTable(layout, 0, /*params_only=*/true, /*param_bf16=*/true));
  const int s = layout.layer_segment(0);
  SegmentChunksHold params(store, s, SegmentKind::Params, Access::Read);
  EXPECT_EQ(params.view(0).dtype(), DType::BF16);
  EXPECT_THROW(params.chunks(), BugError);
  const TensorSlot& q = layout.segments()[s].tensors[kQW];
  const TensorView qv = params.tensor_view(q);
  EXPECT_EQ(qv.elements(), q.numel);
  EXPECT_EQ(qv.bf16(), params.view(q.chunk).bf16() + layout.segments()[s].offset_in_chunk(q));
  SegmentHold head(store, layout.head_segment(), SegmentKind::Params, Access::Read);
  EXPECT_THROW(head.data(), BugError);
  EXPECT_NE(head.view().bf16(), nullptr);
}

}  // namespace
}  // namespace stratum

// Tests for src/core/tensor_view.h (Note [typed views]) and the store handing units out as typed
// views: a bf16 unit is never readable as float*, slices land on the right element.
#include "core/tensor_view.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "core/thread_pool.h"
#include "model/block_policy.h"
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

// A view has a shape: flat, or the matrix the layout says a weight is; a Linear refuses a weight
// whose shape is not the (N, K) it multiplies by, and the store's tensor views carry the shape.
TEST(TensorView, MatricesHaveTheirShapeAndLinearChecksIt) {
  std::vector<float> w(12 + 4, 1.0f);  // padding after a 3 x 4 matrix, as in a store unit
  const TensorView flat = TensorView::of(w.data(), w.size());
  EXPECT_EQ(flat.rank(), 1);
  EXPECT_EQ(flat.rows(), 16u);
  const TensorView m = flat.matrix(3, 4);
  EXPECT_EQ(m.rank(), 2);
  EXPECT_EQ(m.rows(), 3u);
  EXPECT_EQ(m.cols(), 4u);
  EXPECT_EQ(m.elements(), 12u);
  EXPECT_EQ(m.slice(4, 4).rank(), 1) << "a slice is flat";
  EXPECT_THROW(flat.matrix(5, 4), BugError) << "20 elements are not there";

  ThreadPool pool(1);
  const std::unique_ptr<Ops> ops = ops_make(pool);
  std::vector<float> x(2 * 4, 1.0f), y(2 * 3, 0.0f);
  for (const Linear* linear : std::initializer_list<const Linear*>{new GemmLinear, new RowDotLinear}) {
    const std::unique_ptr<const Linear> owned(linear);
    linear->nt(*ops, y.data(), 3, x.data(), 4, m, 2, 3, 4);  // y (2,3) = x (2,4) @ w^T, w (3,4)
    EXPECT_EQ(y, std::vector<float>(6, 4.0f));
    std::vector<float> y4(2 * 4, 0.0f);
    EXPECT_THROW(linear->nt(*ops, y4.data(), 4, x.data(), 3, m, 2, 4, 3), BugError)
        << "a (3,4) weight where a (4,3) one is multiplied by";
    linear->nt(*ops, y4.data(), 4, x.data(), 3, flat, 2, 4, 3);  // a flat view: only its size is known
  }
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
  RamSegmentStore store(UnitTable(layout, 0, UnitSet::Inference, /*param_bf16=*/true));
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

// Runs a training or inference pass over units held by a SegmentStore, group by group of its
// step schedule.
// Note [step schedule]: forward visits embed (positions, then each vocabulary block wte.k; Llama
// has no positions, its embed segment is empty),
// layer.0 .. layer.L-1, head, keeping only each block's input (its "acts" unit in the store, so
// a tiered store can spill it); the head computes the loss and its backward one vocabulary block
// at a time (Note [head passes]); backward visits layer.L-1 .. layer.0, recomputing each block's
// internals from its input; the embedding backward runs last (positions, then each vocabulary
// block); an untied LM head (Llama) reads its own vocabulary blocks lm_head.k in the head passes
// and its gradients are final after them, while the token embedding's blocks then only get the
// embedding's gradients; the optimizer then visits every segment chunk by chunk (params, grads and both moments
// of one chunk at a time, Note [segment chunks]). Vocabulary blocks are segments of their own, so they stream,
// update and overlap like layers.
// Note [one schedule] (store/step_schedule.h): that order is written once, in schedule_build(),
// as a StepSchedule. The executor then runs it: group_run() tells the store where the step is,
// holds exactly the units the group lists, and dispatches on the group's work, so what the store
// prefetches and evicts, the planner's replay and the minimum budget (schedule_min_bytes) all
// follow from the same list. A pass runs a range of groups: training runs all of them, a loss or
// logits pass the forward and the head's log-sum-exp groups.
// Note [optimizer overlap]: OptimizerMode says where AdamW runs. Inline: after the backward, on
// the training thread. Overlapped (no clipping only): a segment's update does not depend on any
// other segment, so it is queued on the optimizer worker as soon as the segment's gradients are
// final (head after the head, each layer after its backward, embed last) and overlaps the
// backward of earlier layers. Pipelined (exact clipping): every gradient is needed for the norm
// first, so all updates are queued after the backward, in forward order, and run while the next
// step's forward proceeds; the forward (and the head) wait for a segment's update before
// reading it, and sync() waits for all. Every element gets the same arithmetic in every mode,
// so the bits are the same. ZerothOrder: Note [zeroth-order step]. Does not choose placement or
// own the store.
// Note [embedding rows ahead]: with Pipelined updates the forward would start by waiting for the
// whole token embedding's update (every vocabulary block's params, grads and moments read, three
// written back, with nothing computing beside it: under a budget the largest wait of a step),
// although its lookup needs only the rows of the step's tokens. So those rows are gathered one
// step ahead: the trainer says which inputs follow (InputsAhead; its batches are a function of
// the step), the worker copies their rows of the params and moments from each block it has just
// updated (the previous step's update), the block's final gradients give theirs, and once the
// clip coefficient is known the same elementwise AdamW runs on those rows (the same arithmetic
// on the same values: the rows the blocks' own update will give). The next step's lookup is one
// group that holds no vocabulary block and adds them; the blocks' Optimizer groups sit before
// the head's log-sum-exp groups (a tied head reads them there; an untied LM head's blocks wait
// there too), so their updates overlap the forward. A step whose inputs are not the ones
// gathered for (the first, one without InputsAhead, a wrong guess), and every loss and logits
// pass, reads the blocks, updated, outside the schedule, as does gathering rows the updates
// queued before did not know to gather. The same bits in every case. A fallback waits for every
// queued update (the embedding's are queued last): a validation pass right after a step no
// longer overlaps its forward with the layers' updates (it is not timed). In one process on the host with a
// trained token embedding (a data-parallel owner sends its parameters at the step's end instead),
// when the five buffers of rows (N*B*T rows at most, counted in fixed_bytes) stay within a
// quarter of the embedding or 16 MiB: with larger batches the step's compute dwarfs the wait.
// attach() forgets the rows (they came from another store's blocks).
// Note [zeroth-order step]: MeZO/ZO2's forward-only training (zo_step). The schedule is one
// forward (ending with the head's log-sum-exp groups, no backward) whose every group computes
// both of MeZO's passes on one hold of its parameters, as ZO2 does: the boundary activation
// units are two (B,T) hidden states wide (activation_unit_floats with zeroth_order), the first
// for the +eps*z pass, the second for the -eps*z pass, and the head keeps a scratch per pass.
// The store holds parameters and boundary activations only (UnitSet::ForwardOnly). With LoRA
// adapters only their segments are perturbed and updated (the base's groups read it). A group
// that holds a segment's parameters for the first time in the step applies Ops::zo_update to
// them and computes the first pass: the previous step's pending update (restore +eps*z, then
// p -= lr * (g * z + wd * p)) and this step's perturbation +eps*z'; then -2*eps*z' and the
// second pass. So the weights cross the disk once per step (ZO2) and z is regenerated, never
// stored (Note [zo noise] in core/zo_noise.h). Each layer is two such groups, its attention half
// and its MLP half (Note [block halves] in model/param_layout.h), each holding the chunks with
// a tensor of its half and applying the perturbations to that half's tensors only: a group holds
// at most the MLP's weights, so the next layer's attention and more are read while it computes. A tied token embedding is held twice, by the
// lookup and by the head: the lookup's second pass reads a copy of the block given -2*eps*z'
// (the same elementwise operation on the same values), so that the head's first pass still
// finds +eps*z'; the head's hold then applies -2*eps*z' for its second pass and is released
// discarded (Note [discarded holds] in store/segment_store.h): a tiered store whose file holds
// the +eps*z' weights drops that copy instead of writing it, and the next hold, seeing the unit
// stale, applies the same -2*eps*z' to it again before its own update: the same operation on the
// same data. Every weight thus sees the operations of the two-pass schedule in the same order,
// and each pass's kernels run on the same operands: the same bits as two separate forwards. The
// projected gradient g = (L+ - L-) / (2 eps) is known after the head; its update waits, pending,
// for the next step's first holds, or for sync(), loss() or logits_last(), which apply it in a
// pass over the parameters alone (the same elementwise arithmetic: the same bits wherever it
// lands).
// Note [gradient accumulation]: with micro_batches N > 1 (--grad-accum N), a training step runs
// the forward, head and backward groups N times, once per micro-batch of (B, T) tokens (the
// inputs and targets hold the N micro-batches back to back), then updates once. Each
// micro-batch's head backward scales by 1 / (N*B*T), so its gradients are its share of the mean
// loss over the global batch. After the group that completes a segment's gradients in micro-batch
// k, a GradAccum group folds them into the segment's GradSum units, chunk by chunk: k = 0 copies
// (GradSum = Grads), 0 < k < N-1 adds (GradSum += Grads), k = N-1 writes Grads = GradSum + Grads.
// So Grads then hold ((g0 + g1) + ...) + g(N-1), summed in micro-batch order whatever runs them,
// and the norm, the clipping and AdamW read them as with one batch (the last GradAccum group is
// where Note [gradients final] declares them final). Optimizer groups sit where they do with one
// micro-batch: in the first one's forward (Pipelined), after the last one's backward
// (Overlapped), after everything (Inline). The step's loss is the mean of the micro-batch losses,
// summed in double in order. N = 1 has no GradSum units and no GradAccum groups: its bits are the
// same as before accumulation existed. Micro-batch k of step t draws LoRA dropout with pass
// index t*N + k (Note [lora dropout] in model/lora.h). Not with zeroth-order steps.
// Note [masked loss]: targets below 0 are no loss targets (Note [loss mask] in
// data/token_file.h: instruction tuning's prompt tokens). The step's loss is the mean over the
// targets that count in all of its micro-batches on all ranks, as PyTorch's cross-entropy with
// ignore_index over the whole batch and Hugging Face's Trainer with gradient accumulation
// (num_items_in_batch): train_pass counts each micro-batch's targets on the host, the ranks
// all-gather the counts before the first backward, and every head backward scales by 1 / (their
// sum), the same number on every rank, so the bits stay those of one process. A micro-batch's own
// loss is the mean over its counted targets; the step's is their mean weighted by the counts,
// summed in double in k order (without a mask: the plain mean of Note [gradient accumulation],
// the same bits as before). A step with no target that counts has loss 0 and zero gradients.
// Note [data parallel]: with a Communicator of P ranks (`mpirun -np P`), rank r runs micro-batches
// k = i*P + r (i = 0 .. micro_batches - 1) of the step's N = micro_batches * P, and its GradAccum
// groups pass the running sum along the ranks in k order: for k > 0 a rank receives the sum of
// micro-batches 0 .. k-1 from rank (r-1) mod P into its GradSum chunk (in place of a sum of its
// own), adds its gradient as above, and sends the new sum to rank (r+1) mod P. Rank P-1 (k = N-1)
// completes the final gradients, summed in the single process's order whatever P is; where they
// go from there is Note [zero sharding].
// The step's loss is gathered from every rank and summed in k order. Sends are copies in flight
// (Communicator::send), awaited at the end of the step; receives block where the data is first
// needed. With P > 1, GradSum never holds anything past its group.
// Note [zero sharding]: each trainable segment has one owner rank (owner_: the segments in
// forward order cut into P contiguous runs of about equal bytes). Rank P-1 (k = N-1) sends a
// segment's final gradients to its owner only, which receives them in a GradShare group where
// they become final (ZeRO stage 2: no other rank holds them); each rank computes the squared
// norms of its own segments' tensors and the ranks all-gather them, so every rank sums the
// single process's values in the single process's order (exact global-norm clipping). Only the
// owner runs a segment's AdamW, so only the owner ever touches its moments (stage 1: a rank's RAM
// or budget holds about 1/P of them); at the end of the step (after the updates, which waits for
// the optimizer worker) each owner sends its updated parameters to every other rank
// (params_share), so all ranks start the next step with the same bits. Those sends leave at the
// end of the step (Inline: each chunk's as its update ends, while the update holds it, so a
// budget that evicted it since does not read it again); each rank receives a segment's
// parameters only where a group first reads them (group_run, params_receive: in the next
// forward, so the transfer of later segments overlaps
// the compute of earlier ones) or before anything outside reads them (sync). Every owner sends in
// forward order and every rank receives in forward order, so one tag keeps them matched. A segment's tensors go
// to one owner whole: the vocabulary blocks of the embedding (and of an untied head) are one run,
// placed where its middle falls. A checkpoint's optimizer state is one shard per rank, each
// written by its rank into the checkpoint rank 0 is writing (TrainRun::checkpoint_optimizer_write
// and checkpoint_shard_write, optimizer_shard_name in weights/model_io.h): no rank ever holds
// another's moments, and the shards load on any number of ranks.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/aligned_buffer.h"
#include "backend/backend.h"
#include "core/thread_pool.h"
#include "ops/ops.h"
#include "model/gpt2_head.h"
#include "model/model_config.h"
#include "model/param_layout.h"
#include "model/transformer_block.h"
#include "obs/trace_recorder.h"
#include "store/device_segment_store.h"
#include "store/segment_store.h"
#include "store/step_schedule.h"
#include "exec/optimizer_worker.h"
#include "dist/communicator.h"

namespace stratum {

// Note [activations offload]: what a block's backward reads its forward internals (the
// attention's inputs and statistics, the MLP's pre-activations: TransformerBlock) from.
// Recompute: one set in the executor's buffers, refilled by running the block forward again from
// its input (the boundary activation) in the backward. Keep: one set per layer in the executor's
// buffers (L times the memory, no second forward). Offload: each layer's set is a store unit
// (SegmentKind::Internals): its forward group overwrites it, its backward group reads it, and a
// tiered store writes it behind the forward and reads it back ahead of the backward like any
// unit, so under a budget the internals cross the disk instead of being recomputed (SSDTrain),
// and with room they stay in RAM (as keep). The kernels and their inputs are the same in all
// three, so the bits are. Auto: the plan chooses between recompute and offload from the budget
// and the measured compute and disk rates (train and plan resolve it before making an executor).
enum class ActivationPolicy { Recompute, Keep, Offload, Auto };
const char* activation_policy_name(ActivationPolicy policy);  // "recompute", "keep", "offload", "auto"
// Parses a --activations value; throws Error naming the flag and the choices.
ActivationPolicy activation_policy_parse(const std::string& text);

enum class OptimizerMode { Inline, Overlapped, Pipelined, ZerothOrder };
// "inline", "overlapped", "pipelined", "zeroth-order"
const char* optimizer_mode_name(OptimizerMode mode);

// The mode training in one process uses (with ranks, plan_mode makes Pipelined Inline: Note [plan
// ranks] in plan/planner.h). worker: the updates run on the optimizer worker (under a budget, or
// beside a device); streamed: the state streams through a RAM budget from the offload files.
//   - With clipping and a worker they overlap the next step's forward, where their I/O hides
//     behind compute; in RAM with clipping they run inline (a worker would only compete for the
//     same cores).
//   - Without clipping they overlap the backward (ZeRO-Offload's order), except when streamed
//     (Note [streamed updates after the backward]).
//
// Note [streamed updates after the backward]: with --grad-clip 0 under --mem-budget the updates
// queued during the backward competed with it for the budget and the disk: each layer's update
// (its moments read, parameters and moments written) trails its backward by a layer or more, its
// chunks and the next backward's units evict each other, and the worker finishes after the
// backward. GPT-2 small B4 T256 (2 GB/s disk), two rounds: at 500M 4707/4725 ms overlapped
// against 4374/4354 pipelined (-7..-8%), at 200M 5720/5015 against 5196/4660 (-7..-9%), reads
// 4.2/3.7 GB a step against 2.6; the same bits, since with no clipping the update's coefficient
// is 1 in either order. So a streamed run takes the pipelined order without clipping too.
OptimizerMode optimizer_mode_for(double grad_clip, bool worker, bool streamed);

// Note [update thread]: on the host, Pipelined updates (under a budget: they overlap the next
// forward) run on the optimizer worker, one thread beside the training pool, only where the
// process has a CPU that the pool does not use (optimizer_worker_wanted). Otherwise the worker,
// like the I/O threads, takes CPU time from the pool's threads in the forward, and OpenBLAS splits
// each product statically over them, so a thread descheduled for the worker holds the product up
// at its barrier. Then the training thread runs each update itself, on the pool: the update
// queued after the norm is kept (deferred_) and run at the segment's Optimizer group in the next
// step, just before its forward, where the forward would have waited for the worker (or in
// sync(), loss() and logits_last(), which run or wait for it there too). One run ahead of its
// group (sync, a lookup from the vocabulary blocks) first tells the store the step is at that
// group, and its chunks are pinned from the norm on as the worker's are (Note [owed uses]): that
// move passes other segments' Optimizer groups, whose gradients must not count as dead while
// their updates are owed (a tiny Llama at its minimum budget lost them). The same arithmetic on
// the same values: the same bits. The plan then times the updates as the training thread's
// compute, and the minimum budget holds no update beside another group (163 MiB against 175 MiB
// for GPT-2 small at B=4 T=256). Two cores, GPT-2 small at 25% of its state, interleaved
// rounds: 3.3% faster a step (docs/benchmarks.md). Overlapped updates (in RAM without clipping)
// keep the worker: there the backward's products hide its memory-bound AdamW, and the same runs
// were 5% slower with each update on the pool right after its backward (the path stays, for
// optimizer_worker_set). Beside a device the worker stays too (the pool's CPUs are idle there:
// Note [host optimizer]).
bool optimizer_worker_wanted(int compute_threads);

// Note [device updates before their forward]: AdamW on the device with exact clipping runs
// Pipelined, as deferred updates on the training thread (Note [update thread]): each segment's
// update is queued on the device stream at its Optimizer group, just before its forward in the
// next step. Under a --gpu-mem-budget the state exceeds, Inline ran every update after the
// backward, where the device had nothing to compute beside their copies (each chunk's
// parameters, gradients and both moments up, the three written back down), and the forward then
// uploaded every parameter again. Pipelined, a segment's update units are prefetched while the
// previous segment's forward computes, and the forward reads the parameters the update left on
// the device. In GPU memory the same kernels run at other points of the stream; the mode is the
// same there so that a whole-state run prints the minimum budget a budgeted one is refused at.
// The same arithmetic on the same values: the same bits. Without clipping the device runs
// Overlapped (each update right after its backward, its gradients still there).

// Which rank of how many an executor is (Note [data parallel]): its communicator's when it has
// one; the planner's executors take it from their request (Note [plan ranks] in plan/planner.h).
struct RankShape {
  int rank = 0;
  int ranks = 1;
};

struct StepResult {
  float loss = 0.0f;
  float grad_norm = 0.0f;   // before clipping
  float grad_scale = 1.0f;  // clipping coefficient applied
  double optimizer_wait_ms = 0.0;  // the training thread waiting for updates on the worker to finish
};

// One zeroth-order step's hyper-parameters (Note [zeroth-order step]).
struct ZoHyper {
  std::uint64_t seed = 0;  // the run's seed (Note [zo noise])
  long step = 0;           // 0-based
  double eps = 1e-3;       // perturbation scale
  double lr = 1e-6;
  double weight_decay = 0.0;  // on tensors with weight_decay set, as MeZO
};

class Executor {
 public:
  // Floats of one boundary-activation unit for batches up to (max_batch, max_seq); zeroth_order:
  // the hidden states of both passes (Note [zeroth-order step]).
  static std::size_t activation_unit_floats(const GptConfig& config, int max_batch, int max_seq,
                                            bool zeroth_order = false);

  // Floats of one Internals unit (--activations offload) for batches up to (max_batch, max_seq).
  static std::size_t internals_unit_floats(const GptConfig& config, int max_batch, int max_seq,
                                           const ParamLayout& layout);

  // activations: where the backward finds each block's internals (Note [activations offload]);
  // Offload needs a unit table with Internals units (internals_unit_floats). Not Auto.
  // mode: Note [optimizer overlap]; train_step() with Overlapped needs grad_clip <= 0.
  // The store is attached separately (attach) so its budget can be sized from fixed_bytes().
  // precision: what the matrix products compute in (Note [bf16 products]).
  // backend: where the ops run (backend/backend.h); off the CPU every buffer is the backend's
  // (Note [ops memory]), the tokens are uploaded each pass, the attached store must hand out that
  // memory (DeviceSegmentStore) and AdamW runs on the executor's own Ops in schedule order, or
  // on the CPU beside it (optimizer_on_host).
  // micro_batches: of (max_batch, max_seq) each per training step on this rank (Note [gradient
  // accumulation]); comm: the ranks of a data-parallel run (Note [data parallel]; null: one
  // process). With micro_batches * ranks above 1 the unit table needs GradSum units.
  // rows: the blocks' row chunk and MLP sub-chunk (Note [row chunks] in model/block_policy.h).
  // attention_lanes: Ops::attention_lanes_limit (0: the backend's).
  // plan_rank: without comm, the rank of a data-parallel run this executor is made for by the
  // planner (Note [plan ranks] in plan/planner.h): its schedule, owners and buffers are that
  // rank's, and it never runs a step.
  Executor(ThreadPool& pool, const GptConfig& config, const UnitTable& units, int max_batch, int max_seq,
           ActivationPolicy activations = ActivationPolicy::Recompute, OptimizerMode mode = OptimizerMode::Inline,
           Precision precision = Precision::Fp32, Backend backend = Backend::Cpu, int micro_batches = 1,
           Communicator* comm = nullptr, BlockRows rows = {}, int attention_lanes = 0, RankShape plan_rank = {});
  Executor(ThreadPool& pool, const GptConfig& config, SegmentStore& store, int max_batch, int max_seq,
           ActivationPolicy activations = ActivationPolicy::Recompute);
  ~Executor();
  void attach(SegmentStore& store);
  // Note [host optimizer] (store/device_segment_store.h): off the host, AdamW runs on the CPU, on
  // the optimizer worker, over the attached DeviceSegmentStore's host store, overlapped with the
  // device's compute (ZeRO-Offload); the moments never reach the device. Before attach, with mode
  // Overlapped or Pipelined, in one process. The same arithmetic: the same bits.
  void optimizer_on_host();
  // Note [update thread]: whether host updates run on the optimizer worker (the constructor
  // decides with optimizer_worker_wanted); optimizer_worker_set overrides it before attach (tests
  // run both ways on any machine). Only with mode Overlapped or Pipelined on the host.
  bool optimizer_worker() const { return worker_ != nullptr; }
  void optimizer_worker_set(bool on);
  const Ops& ops() const { return *ops_; }
  // For owners of memory of these ops that may outlive the executor (DeviceSegmentStore).
  std::shared_ptr<const Ops> ops_shared() const { return ops_; }
  // Records a span per block forward/backward, head, update and wait into `trace` (null = off).
  void trace_set(TraceRecorder* trace) { trace_ = trace; }
  // The trace where the device computes off the host, for its own timeline (Note [device timeline]
  // in store/queue_span.h); else null.
  TraceRecorder* device_trace() const { return ops_->host_memory() ? nullptr : trace_; }

  // Bytes the executor itself holds (the backward's gradient, block internals, workspace, head scratch,
  // the backend's matrix-product scratch).
  std::size_t fixed_bytes() const;
  // Smallest store RAM budget that can run a training step: the largest set of units held at
  // once (with the optimizer overlap, plus what the worker holds).
  std::size_t min_store_bytes() const;
  // The same for the host store under a device tier: with the host optimizer the updates hold
  // the host's units beside the step's (Note [host optimizer]); else min_store_bytes().
  std::size_t min_host_store_bytes() const;
  const StepSchedule& schedule() const { return schedule_; }
  // Per group: the units it releases discarded (Note [zeroth-order step]: a tied block's second
  // hold; empty outside it).
  const std::vector<std::vector<int>>& discards() const { return zo_discard_at_; }

  int micro_batches() const { return micro_batches_; }

  // Writes the n inputs (micro_batches() x (B,T), back to back) of the training step `ahead` (1
  // or 2) steps after the one in progress; false when there is none or it has another size (Note
  // [embedding rows ahead]).
  using InputsAhead = std::function<bool(int ahead, std::int32_t* inputs, std::size_t n)>;
  // One optimizer step: forward, backward, global-norm clipping (grad_clip > 0) and AdamW.
  // inputs/targets: micro_batches() micro-batches of (B,T), back to back. ahead: the following
  // steps' inputs, for Note [embedding rows ahead] (without it every lookup reads the blocks; the
  // bits are the same either way).
  StepResult train_step(const std::int32_t* inputs, const std::int32_t* targets, int B, int T,
                        const AdamWHyper& hyper, double weight_decay, double grad_clip,
                        const InputsAhead& ahead = {});
  // Training steps whose embedding lookup took its rows ahead (Note [embedding rows ahead]).
  long rows_ahead_steps() const { return rows_ahead_steps_; }

  // One zeroth-order step (mode ZerothOrder, Note [zeroth-order step]): loss is (L+ + L-) / 2,
  // grad_norm the projected gradient |g|.
  StepResult zo_step(const std::int32_t* inputs, const std::int32_t* targets, int B, int T, const ZoHyper& hyper);

  // Forward + backward for inputs/targets (micro_batches() x (B,T)); writes every parameter's
  // gradient into the store's Grads units (overwriting) and returns the mean cross-entropy.
  float forward_backward(const std::int32_t* inputs, const std::int32_t* targets, int B, int T);
  // Forward only: mean cross-entropy.
  float loss(const std::int32_t* inputs, const std::int32_t* targets, int B, int T);
  // Logits (V) of the last position of tokens (1, T), T <= max_seq.
  void logits_last(const std::int32_t* tokens, int T, float* logits);

  // Sum of squared gradients of the last forward_backward (double, fixed order; computed while
  // each segment's gradients were final, or at the backward's end: Note [norm in one pass]; this
  // reads nothing).
  double grad_sum_squares() const;
  // AdamW on every segment, on the calling thread; weight decay applies to tensors with
  // weight_decay set.
  void optimizer_step(const AdamWHyper& hyper, double weight_decay, float grad_scale);
  // The step whose LoRA dropout masks the following training passes draw (Note [lora dropout]
  // in model/lora.h): the run's seed and the 0-based optimizer step (micro-batches: Note [gradient
  // accumulation]). Without lora_dropout, no-op.
  void lora_dropout_step(std::uint64_t seed, long step);
  // Waits until every queued update has been applied and every other rank's updated parameters
  // have arrived (before reading parameters from outside: saving, hashing), and applies a pending
  // zeroth-order update; rethrows a failed update's error.
  void sync();
  // Trainable parameters this rank updates (and holds AdamW moments for): all in one process.
  std::size_t owned_trainable_params() const;
  // This rank updates segment s and holds its moments (Note [zero sharding]); always in one process
  // (and in zeroth-order runs, which have no owners).
  bool updates_segment(int s) const { return ranks() == 1 || owner_.empty() || owner_[s] == rank(); }
  // Per unit: another rank's moments, which this rank never acquires (Note [zero sharding]); empty
  // in one process. TieredStoreOptions::unused, and what the plan leaves out of a rank's state.
  std::vector<bool> units_unused() const;
  // The rank that updates trainable segment s (Note [zero sharding]; -1 frozen, 0 in one process).
  int segment_owner(int s) const { return owner_.empty() ? (layout_.trainable(s) ? 0 : -1) : owner_[s]; }
  // The ranks of the run (1: one process) and this executor's (Note [data parallel]).
  int ranks() const { return shape_.ranks; }
  int rank() const { return shape_.rank; }

 private:
  // What a pass over the groups computes and the state its groups hand on.
  enum class PassKind { Train, Loss, Logits, ZoFlush };
  struct Pass {
    PassKind kind;
    const std::int32_t* inputs;
    const std::int32_t* targets;  // Train, Loss
    int B, T;
    bool queue_updates = false;  // Overlapped: queue each segment's update at its Optimizer group
    AdamWHyper hyper{};
    double weight_decay = 0.0;
    int logits_row = 0;          // Logits: the row whose logits are wanted, and where they go (V)
    float* logits = nullptr;
    int mean_rows = 0;           // Train: the rows the step's mean loss is over (Note [gradient accumulation])
    int micro = 0;               // Train: the micro-batch on this rank
    float loss = 0.0f;           // after the last HeadLse group (Train, Loss)
    float* dcur = nullptr;       // backward: the gradient at the current block boundary, in dacts_
    // ZerothOrder: what the first hold of a segment's parameters in this pass applies, when it
    // updates or perturbs (keys are step keys here, made per tensor in zo_apply_unit).
    ZoUpdate zo_update{};
    bool zo() const { return zo_update.update || zo_update.perturb; }
    // A zeroth-order step (Note [zeroth-order step]): each group computes half 0 (after
    // zo_update), then applies zo_minus and computes half 1 (the second hidden state of each
    // activation unit, the second head scratch); loss_minus is half 1's loss.
    bool dual = false;
    ZoUpdate zo_minus{};
    int half = 0;
    float loss_minus = 0.0f;
    const float* vocab_copy = nullptr;  // half 1 of a tied block's lookup: its -eps*z copy
  };

  void check_shape(int B, int T) const;
  void schedule_build();
  // The forward's groups (embed, vocabulary blocks, layers, head's log-sum-exp), with before(s)
  // called ahead of a segment's first group and params(s) the access of its parameters.
  // rows: one lookup group from the rows ahead (Note [embedding rows ahead]) in place of the
  // vocabulary blocks' groups, whose before() then comes ahead of their head log-sum-exp groups.
  // gather: with rows, also the optional groups that gather the next step's rows (the first
  // micro-batch's forward).
  // halves: each layer as two groups, its attention half and its MLP half (Note [block halves] in
  // model/param_layout.h), each holding the chunks with a tensor of its half.
  void forward_groups_add(const std::function<void(int)>& before, const std::function<Access(int)>& params,
                          bool rows = false, bool gather = false, bool halves = false);
  // The half of a block tensor (a layer's, or an adapter's: its module's) or Whole (any other).
  BlockPart tensor_part(int segment, int tensor) const;
  double attention_share() const;  // the attention half's share of a block forward's multiply-adds
  // Appends a use of each params chunk of segment seg that holds a tensor of `part` (Note [block
  // halves]).
  void part_chunks_add(std::vector<UnitUse>& uses, int seg, BlockPart part, Access access) const;
  // Group g is `part` of its layer (group_part), with that share of the layer's compute time
  // (StepSchedule::group_share, for the plan).
  void group_part_set(int g, BlockPart part, double share);
  BlockPart group_part(int g) const {
    return static_cast<std::size_t>(g) < group_part_.size() ? group_part_[g] : BlockPart::Whole;
  }
  void zo_schedule_build();
  // pass.zo_update applied to the parameters group g holds first in the step (a stale unit's
  // pass-2 perturbation redone first).
  void zo_apply(int g, const GroupHolds& holds, const Pass& pass);
  // u (step keys) applied to a params unit's tensors of `part` at base (its buffer, or a copy).
  void zo_apply_unit(int unit, float* base, const ZoUpdate& u, BlockPart part);
  void zo_dual_compute(int g, const GroupHolds& holds, Pass& pass);  // both halves (Pass::dual)
  void zo_flush();                     // applies a pending update (a ZoFlush pass over the forward groups)
  void run(int first, int last, Pass& pass);  // groups [first, last)
  // Forward, head and backward (the groups before the inline updates); returns the mean loss.
  // inputs/targets (B*T each) where the ops can read them: as given on the host backend, else
  // uploaded into tokens_ (Note [ops memory]).
  void tokens_stage(const std::int32_t*& inputs, const std::int32_t*& targets, int BT);
  float train_pass(const std::int32_t* inputs, const std::int32_t* targets, int B, int T, bool queue_updates,
                   const AdamWHyper& hyper, double weight_decay);
  void group_run(int g, Pass& pass);
  // A group held a part at a time (StepSchedule::hold_span): each(holds, chunk) per part, in a
  // trace span, the store's window refilled after each release.
  void chunks_run(int g, const Pass& pass, const std::function<void(const GroupHolds&, int)>& each);
  void grad_accum_run(int g, const Pass& pass);  // a GradAccum group (Note [gradient accumulation])
  void grad_share_run(int g, const Pass& pass);  // a GradShare group (Note [data parallel])
  void group_compute(int g, const GroupHolds& holds, Pass& pass);
  // A layer group's held parameter chunks as the block takes them: views of the layer's (empty
  // where not held) and the adapters' chunks (null where not held), with the pass's dropout.
  struct HeldLayer {
    HeldLayer(const Executor& e, int g, const GroupHolds& holds, const Pass& p);
    std::vector<TensorView> views;
    std::vector<float*> adapters;
    LoraChunks lora;
  };
  // A LayerForward group of one half (Note [block halves]); half: the offset of the pass's hidden
  // state in the activation units (Pass::half).
  void layer_half_forward(int g, const GroupHolds& holds, const Pass& pass, std::size_t half);
  std::string group_name(int g, const Pass& pass) const;  // the trace span's name
  // Note [gradients final]: the one place a segment's gradients are declared final for the step.
  // group_run() calls it after the group that last writes them (derived from the schedule in
  // schedule_build: head and untied LM-head blocks after the head, each layer after its
  // backward, embed and the vocabulary blocks after the embedding backward), while they are
  // still held. It records the per-tensor squared sums the global norm needs; a data-parallel
  // run reduces the segment's gradient across ranks here, before anything reads it. The update
  // is queued by the segment's Optimizer group, after the hold ends.
  void grads_final(int segment, int chunk, const float* grads);  // the segment's chunk `chunk`
  // The adapters of a layer's group as held (empty without LoRA; grads: the backward's), with
  // dropout in a training pass (Note [lora dropout]).
  LoraChunks lora_chunks(const GroupHolds& holds, int layer, bool grads, const Pass& pass) const;
  // pinned: the chunks' units were pinned by optimizer_queue; each chunk's are unpinned as it is
  // released (Note [owed uses]) and *pinned counts those done. share: each chunk's parameters go
  // to the other ranks as soon as they are updated, while held (Inline's optimizer_step, which
  // updates in forward order: Note [zero sharding]).
  void optimizer_segment(const Ops& ops, int segment, const AdamWHyper& hyper, double weight_decay,
                         float grad_scale, int* pinned = nullptr, bool share = false);
  // An update optimizer_queue owed (its chunks pinned): unpins each chunk as it is done, and the
  // rest if it fails.
  void optimizer_segment_owed(const Ops& ops, int segment, const AdamWHyper& hyper, double weight_decay,
                              float grad_scale);
  // Pins (+1) or unpins (-1) the units of one chunk of the segment's update for its Optimizer group.
  void chunk_pin(int segment, int chunk, int delta);
  void optimizer_queue(int segment, const AdamWHyper& hyper, double weight_decay, float grad_scale);
  // Pipelined: the segment's queued update has been applied (run here when it was deferred, Note
  // [update thread]); at_group: the store told the step is at its Optimizer group.
  void update_wait(int segment, bool at_group = true);
  // Note [embedding rows ahead] (exec/embed_rows.cpp).
  void rows_begin(const std::int32_t* inputs, std::size_t n, const InputsAhead& ahead);  // train_step's start
  void rows_end(const AdamWHyper& hyper, double weight_decay, float grad_scale, const InputsAhead& ahead);
  void rows_lookup(const Pass& pass, float* out);  // the lookup group
  bool rows_optional_run(int g, const Pass& pass) const;  // whether this pass runs optional group g
  // next_'s rows of vocabulary block k's params and moments (the worker's update, a VocabRows group).
  void rows_gather_state(int block, const float* params, const float* m, const float* v);
  void rows_blocks_wait();  // every vocabulary block's queued update applied
  // Copies the rows of next_ that vocabulary block k holds, from its params, moments or grads.
  void rows_gather(int block, const float* data, float* rows) const;
  bool rows_target(int ahead, const InputsAhead& fn);  // next_ = that step's rows; false: none
  // Where layer's internals are: its own set (keep), the one set (recompute) or its held Internals unit.
  TransformerBlock::InternalsAt internals_at(const GroupHolds& holds, int layer) const;
  int act_segment(int layer) const;  // the segment whose acts unit holds layer's input
  int unit_at(int segment, SegmentKind kind, int chunk = 0) const { return units_.index(segment, kind, chunk); }
  void at(int group) { store_->schedule_at(group); }
  // A compute span's trace tag: the GroupWork it does (the planner times the spans by it).
  static int tag(GroupWork work) { return static_cast<int>(work); }

  std::shared_ptr<Ops> ops_;  // the kernels, on the pool the executor was given (shared: ops_shared)
  GptConfig cfg_;
  UnitTable units_;
  const ParamLayout& layout_;
  SegmentStore* store_ = nullptr;
  int max_batch_, max_seq_;
  OpsBuffer dacts_;          // (B,T,C) fp32: the backward's gradient, each block's computed in place
  OpsBuffer tokens_;         // 2 x (B,T) int32: inputs and targets off the host (host_memory() false)
  ActivationPolicy activations_;
  OptimizerMode mode_;
  TransformerBlock blocks_;  // internals: 1 set (recompute), n_layer (keep) or none (offload: in the store)
  Gpt2HeadScratch head_scratch_;
  std::vector<std::vector<double>> grad_squares_;  // [segment][tensor] of the last backward
  // Note [norm in one pass]: grads_final lists each final gradient tensor here and
  // grad_squares_flush() sums the listed ones into grad_squares_ with one sum_squares_many. Where
  // the store keeps every buffer where it is (SegmentStore::buffers_stable: in RAM, or the whole
  // state in GPU memory) the list waits for the backward's end, so the GPU sums a whole gradient's
  // chunks side by side in one launch and one wait (221 launches and waits before, 9.2 ms of
  // GPT-2 small's 122 ms step on an H200); else each grads_final flushes its chunk's tensors while
  // they are held. The same values either way (the same per-tensor sums, added in the same order).
  struct SquaresPending {
    int segment, tensor;
    const float* grads;
    std::size_t n;
  };
  std::vector<SquaresPending> squares_pending_;
  void grad_squares_flush();

  StepSchedule schedule_;
  int forward_end_ = 0;  // one past the head's log-sum-exp groups: where a loss or logits pass ends
  int compute_end_ = 0;  // one past the last group a training pass runs (Inline: the updates follow)
  int micro_batches_ = 1;  // on this rank
  Communicator* comm_ = nullptr;  // null: one process (or one rank), or a plan's rank
  RankShape shape_;               // comm_'s, or the plan's rank (which runs nothing)
  int step_micro_batches() const { return micro_batches_ * ranks(); }  // N of the whole step
  std::vector<int> owner_;  // per segment: the rank that updates it (Note [zero sharding]); -1 frozen
  void grad_squares_share();  // Note [zero sharding]: every rank gets the owners' squared norms
  void params_share();        // ... and their updated parameters (sent; received lazily:)
  void params_send(int s, int chunk, const float* params);  // one chunk's, to every other rank
  std::vector<char> params_pending_;  // per segment: its owner's update is sent, not yet received
  void params_receive(int s);         // receives segment s's parameters if pending
  void params_settle();               // ... every pending segment's, in forward order
  std::vector<int> micro_begin_;  // per micro-batch: its first group (Note [gradient accumulation])
  std::vector<int> group_opt_;               // per segment: its Optimizer group
  std::vector<std::vector<int>> final_at_;   // per group: segments whose gradients are final after it
  std::vector<std::vector<int>> zo_first_at_;    // per group: params units first held in a zo step
  std::vector<std::vector<int>> zo_discard_at_;  // per group: params units held again (released discarded)
  std::vector<char> zo_held_again_;              // per unit: a later group of the step holds it again
  OpsBuffer zo_block_;  // a tied vocabulary block's -eps*z copy (Note [zeroth-order step])
  std::unique_ptr<Gpt2HeadScratch> head_scratch_minus_;  // zeroth-order: the second pass's head
  std::vector<BlockPart> group_part_;  // per group (Whole past its end): a layer group's half
  std::vector<int> forward_segments_;  // segments in the order the forward first reads them
  std::vector<int> update_order_;      // Pipelined: trainable segments in the order their Optimizer groups wait
  // Note [embedding rows ahead].
  struct EmbedRows {
    std::vector<std::int32_t> inputs;  // a step's inputs (micro_batches() x B x T)
    std::vector<std::int32_t> rows;    // their tokens, distinct, ascending
    std::vector<std::int32_t> local;   // inputs as indices into rows
    bool known = false;
  };
  bool rows_ahead_ = false;     // Pipelined, one process, on the host, trained token embedding
  std::size_t rows_max_ = 0;    // rows the buffers have room for
  std::size_t rows_n_ = 0;      // tokens of a step (the last train_step's)
  AlignedBuffer rows_mem_;      // next_'s params, moments and grads rows, ready_'s params rows
  float* next_p_ = nullptr;
  float* next_m_ = nullptr;
  float* next_v_ = nullptr;
  float* next_g_ = nullptr;
  float* ready_p_ = nullptr;
  EmbedRows next_;              // the following step's rows, gathered during this step
  EmbedRows ready_;             // the coming step's rows, updated (in ready_p_)
  bool ready_valid_ = false;
  int next_pmv_blocks_ = 0;     // vocabulary blocks whose rows next_ holds (params and moments)
  int next_g_blocks_ = 0;       // ... (gradients)
  bool next_by_jobs_ = false;   // the queued updates gather next_ (it was known when they were queued)
  bool rows_use_ = false;       // this step's lookup takes ready_
  bool rows_direct_ = false;    // this step's VocabRows groups gather next_ (the updates queued before did not)
  bool rows_gather_g_ = false;  // this step's final gradients fill next_g_
  long rows_ahead_steps_ = 0;

  std::unique_ptr<ThreadPool> worker_pool_;  // the optimizer worker's kernels: 1 thread beside CPU compute
  std::unique_ptr<Ops> worker_ops_;          // the kernels, on worker_pool_
  std::unique_ptr<OptimizerWorker> worker_;
  bool host_optimizer_ = false;          // Note [host optimizer]
  int host_threads_ = 1;                  // the training pool's threads (idle off the host)
  DeviceSegmentStore* device_ = nullptr;  // the attached store, with host_optimizer_
  std::vector<long> update_job_;   // per segment: worker job number of its pending update, 0 = none
  struct DeferredUpdate {          // Note [update thread]: a Pipelined update for the training thread
    bool pending = false;
    AdamWHyper hyper;
    double weight_decay = 0.0;
    float grad_scale = 1.0f;
  };
  std::vector<DeferredUpdate> deferred_;  // per segment
  std::uint64_t dropout_step_key_ = 0;  // lora_dropout_step's (Note [lora dropout])
  std::uint64_t dropout_seed_ = 0;      // lora_dropout_step's arguments, for micro-batches' keys
  long dropout_step_ = 0;
  double update_wait_ms_ = 0.0;    // waited in update_wait since the last train_step returned
  TraceRecorder* trace_ = nullptr;
  // The last zeroth-order step's update, not yet applied (update set while pending; no perturb;
  // Note [zeroth-order step]).
  ZoUpdate zo_pending_{};
};

}  // namespace stratum

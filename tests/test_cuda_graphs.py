"""Training the decoder from CUDA graphs (``cuda_graphs=true``): the loss it records, its
refusals, and on a GPU that it computes what eager PyTorch does. CI has no GPU; the GPU tests run
wherever one is (docs/performance.md says where they last ran)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from benchmarks.step_benchmark import build_dropout_free, compose, random_batch, run_step_benchmark
from seq2seq.data.tokenization import PAD_ID
from seq2seq.errors import ConfigError
from seq2seq.inference.bundle import build_model
from seq2seq.models import Seq2Seq
from seq2seq.pipeline import build_model_config
from seq2seq.training.cuda_graphs import CudaMemory, DecoderGraphs, check_cuda_graphs
from seq2seq.training.loss import DecoderLoss

TINY = ["model.hidden_size=16", "model.embedding_size=8", "data.batch_size=6", "threads=1"]
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="records CUDA graphs")


@pytest.mark.parametrize("decoder", ["bahdanau", "luong"])
def test_decoder_loss_is_the_summed_token_cross_entropy_of_the_model(decoder: str) -> None:
    config = compose([*TINY, f"model.decoder={decoder}"])
    model = build_dropout_free(config, vocab_size=20, device="cpu")
    batch = random_batch(6, 8, 20, "cpu")
    logits, _ = model(batch["src"], batch["src_lens"], batch["tgt_in"])  # (B, T, V)
    expected = F.cross_entropy(
        logits.flatten(0, 1), batch["tgt_out"].flatten(), ignore_index=PAD_ID, reduction="sum"
    )
    memory, summary = model.encoder(batch["src"], batch["src_lens"])
    state = model.initial_state(summary, memory)
    loss = DecoderLoss(model.decoder)(
        batch["tgt_in"], batch["tgt_out"], memory, batch["src_lens"], *state
    )
    torch.testing.assert_close(loss, expected)


@pytest.mark.parametrize(
    ("device", "world_size", "precision", "expected"),
    [
        ("cpu", 1, "32-true", "training runs on cpu. Add trainer=gpu"),
        ("cuda", 2, "32-true", "this run has 2 processes"),
        ("cuda", 1, "bf16-mixed", "needs trainer.precision=32-true, got bf16-mixed"),
    ],
)
def test_setups_that_graphs_cannot_train_are_refused_in_one_paragraph(
    device: str, world_size: int, precision: str, expected: str
) -> None:
    with pytest.raises(ConfigError, match=expected):
        check_cuda_graphs(torch.device(device), world_size, precision)
    check_cuda_graphs(torch.device("cuda"), 1, "32-true")  # what it can train


def losses_match_eager(
    graphs: DecoderGraphs, model: Seq2Seq, lengths: tuple[int, ...], device: str
) -> None:
    """One batch per target length through ``graphs``, each loss checked against eager's."""
    for length in lengths:
        batch = random_batch(6, length, 20, device, seed=length)
        memory, summary = model.encoder(batch["src"], batch["src_lens"])
        state = model.initial_state(summary, memory)
        inputs = (batch["tgt_in"], batch["tgt_out"], memory, batch["src_lens"], *state)
        torch.testing.assert_close(graphs(*inputs), DecoderLoss(model.decoder)(*inputs))


GiB = 2**30


class FakeGpu(CudaMemory):
    """A GPU of ``total`` bytes on which every recording reserves ``per_graph`` more."""

    def __init__(self, total: int, per_graph: int) -> None:
        self.total, self.per_graph = total, per_graph
        self.held = 0  # what this process's allocator reserved
        self.others = 0  # what other processes use

    def reserved(self, device: torch.device) -> int:
        return self.held

    def free_and_total(self, device: torch.device) -> tuple[int, int]:
        return self.total - self.held - self.others, self.total


@pytest.mark.parametrize(
    ("max_graphs", "others", "graphs_kept", "reason"),
    [
        # 10 GiB, 2 GiB a graph: a third would make 6 GiB, past half the GPU.
        (128, 0, 2, "the 2 recorded hold 4.0 GiB, and one more would pass 50% of the GPU's 10.0"),
        # Another process leaves 3 GiB free after the first graph: less than twice 2 GiB.
        (128, 5 * GiB, 1, "3.0 GiB of the GPU is free, less than twice the largest graph's 2.00"),
        (1, 0, 1, "the cap of 1 reached"),
    ],
)
def test_recording_stops_at_the_cap_or_the_memory_and_later_shapes_run_eager(
    monkeypatch: pytest.MonkeyPatch, max_graphs: int, others: int, graphs_kept: int, reason: str
) -> None:
    gpu = FakeGpu(total=10 * GiB, per_graph=2 * GiB)
    recorded = []

    def record(graphs: DecoderGraphs, *inputs: torch.Tensor) -> DecoderLoss:
        # Stands in for the recording (CI has no GPU): eager, reserving what a graph would.
        recorded.append(tuple(inputs[0].shape))
        gpu.held += gpu.per_graph
        gpu.others = others
        return DecoderLoss(graphs.decoder)

    monkeypatch.setattr(DecoderGraphs, "record", record)
    model = build_dropout_free(compose(TINY), vocab_size=20, device="cpu")
    graphs = DecoderGraphs(model.decoder, max_graphs=max_graphs, gpu_memory=gpu)
    lengths = (5, 6, 7, 5, 8, 6)
    losses_match_eager(graphs, model, lengths, "cpu")
    assert len(recorded) == len(graphs.graphs) == graphs_kept  # each shape recorded once
    assert graphs.graph_bytes == graphs_kept * 2 * GiB and graphs.largest_graph_bytes == 2 * GiB
    kept = set(lengths[:graphs_kept])
    assert graphs.eager_batches == sum(length not in kept for length in lengths)
    assert graphs.stopped is not None and graphs.stopped.startswith(reason)
    assert reason in graphs.summary() and f"holding {graphs_kept * 2}.0 GiB" in graphs.summary()


@needs_gpu
@pytest.mark.parametrize("decoder", ["bahdanau", "luong"])
def test_graphed_steps_compute_what_eager_steps_do(decoder: str) -> None:
    # Two shapes, two graphs; after several Adam steps each variant's gradients are compared
    # with eager's from the same weights on the same batch.
    report = run_step_benchmark(
        [*TINY, f"model.decoder={decoder}"],
        ["eager", "cudagraphs"],
        "cuda",
        [5, 9],
        vocab_size=20,
        warmup=2,
        steps=3,
        chunks=1,
    )
    for row in report["rows"]:
        assert "error" not in row, row
        assert row["loss_rel_diff"] < 1e-6 and row["max_grad_rel_diff"] < 1e-5, row


@needs_gpu
def test_one_graph_per_shape_and_eager_beyond_the_cap() -> None:
    config = compose(TINY)
    model = build_dropout_free(config, vocab_size=20, device="cuda")
    graphs = DecoderGraphs(model.decoder, max_graphs=1)
    losses_match_eager(graphs, model, (5, 5, 7), "cuda")
    assert len(graphs.graphs) == 1 and graphs.eager_batches == 1
    assert "1 CUDA graphs recorded" in graphs.summary()


@needs_gpu
def test_every_replay_draws_fresh_dropout_masks() -> None:
    config = compose([*TINY, "model.dropout=0.5"])
    torch.manual_seed(0)
    model = build_model(build_model_config(config, 20, 20)).cuda().train()
    graphs = DecoderGraphs(model.decoder)
    batch = random_batch(6, 7, 20, "cuda")
    memory, summary = model.encoder(batch["src"], batch["src_lens"])
    state = model.initial_state(summary, memory)
    inputs = (batch["tgt_in"], batch["tgt_out"], memory.detach(), batch["src_lens"])
    inputs += tuple(tensor.detach() for tensor in state)
    losses = {float(graphs(*inputs)) for _ in range(4)}
    assert len(graphs.graphs) == 1 and len(losses) == 4  # the same inputs, other masks


@needs_gpu
def test_graphs_replay_in_any_order_and_warm_up_on_one_stream() -> None:
    """Shapes recorded in the order 5, 9, 7 and replayed in another (each replay's forward and
    backward in turn, as training does) give eager's loss and gradients every time; the three
    recordings warmed up on one side stream."""
    config = compose(TINY)
    model = build_dropout_free(config, vocab_size=20, device="cuda")
    graphs = DecoderGraphs(model.decoder)
    eager = DecoderLoss(model.decoder)
    warmup_streams = set()
    for length in (5, 9, 7, 9, 5, 7, 7, 5):
        batch = random_batch(6, length, 20, "cuda", seed=length)
        memory, summary = model.encoder(batch["src"], batch["src_lens"])
        memory, summary = memory.detach().requires_grad_(), summary.detach().requires_grad_()
        wrt = [memory, summary, *model.decoder.parameters()]
        results = []
        for decode in (graphs, eager):
            state = model.initial_state(summary, memory)  # each backward frees the bridge's graph
            loss = decode(batch["tgt_in"], batch["tgt_out"], memory, batch["src_lens"], *state)
            grads = torch.autograd.grad(loss, wrt, allow_unused=True)
            # A parameter the loss does not read (the bridge: it runs before) may get None.
            grads = tuple(
                torch.zeros_like(x) if g is None else g for x, g in zip(wrt, grads, strict=True)
            )
            results.append((loss.detach().clone(), [g.clone() for g in grads]))
        warmup_streams.add(graphs.warmup_stream)
        (graphed_loss, graphed_grads), (eager_loss, eager_grads) = results
        torch.testing.assert_close(graphed_loss, eager_loss)
        for graphed_grad, eager_grad in zip(graphed_grads, eager_grads, strict=True):
            torch.testing.assert_close(graphed_grad, eager_grad)
    assert len(graphs.graphs) == 3 and len(warmup_streams) == 1 and None not in warmup_streams

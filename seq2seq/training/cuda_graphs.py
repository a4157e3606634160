"""The decoder's teacher-forced pass and loss, replayed from CUDA graphs (``cuda_graphs=true``).

Shape legend: B batch, S source length, T target length, V target vocabulary.

At the sizes this toolkit trains, a GPU waits for the CPU to launch kernels: the Bahdanau decoder
launches a handful per target step, forward and backward. A CUDA graph records those launches once
and replays them as one (what it gains on an H100: docs/performance.md). A graph holds one shape,
so ``DecoderGraphs`` records one per batch shape (B, T, S) the first time it comes; length
bucketing keeps those few (22 in an epoch of the reverse task), but a real corpus has many more
(Multi30k's RNN recipe: over 128). Each graph keeps its own activations (their size at that
recipe's: docs/multi30k.md), so recording stops at a count and at a share of the GPU's memory, and
later shapes run eager. The encoder stays eager: packing needs the source lengths on the host.

The graphs replay the kernels eager PyTorch would launch, so a step computes what eager does.
Their limits, which ``check_cuda_graphs`` turns into one-paragraph errors: one GPU (recording
under DDP needs DDP's own warm-up and stream set-up, which is not done here), and 32-bit precision
(autocast caches casts across calls, which a replayed graph cannot see).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch
from torch import Tensor, nn

from seq2seq.errors import ConfigError
from seq2seq.models.decoder import AttentionDecoder
from seq2seq.training.loss import DecoderLoss

log = logging.getLogger(__name__)

# Shapes beyond this many run eager: each graph keeps its own activations on the GPU.
MAX_GRAPHS = 128
# Nor is a graph recorded once the graphs would hold more than this share of the GPU's memory
# (taking the next to need as much as the largest so far), or once the GPU has less than twice
# that free: the rest is left to eager batches of other shapes, validation and beam search. On an
# H100 the RNN recipe's first 128 graphs held about 69 of its 80 GB (docs/multi30k.md).
MEMORY_SHARE = 0.5
# Forward and backward passes before recording a shape (``make_graphed_callables``'s default).
WARMUP_PASSES = 3


class CudaMemory:
    """The GPU memory readings ``DecoderGraphs`` decides by (a stand-in replaces it in tests)."""

    def reserved(self, device: torch.device) -> int:
        """Bytes this process's caching allocator holds, graph pools included."""
        return torch.cuda.memory_reserved(device)

    def free_and_total(self, device: torch.device) -> tuple[int, int]:
        """Bytes free on the device (other processes' use counted out) and its size."""
        return torch.cuda.mem_get_info(device)


class DecoderGraphs:
    """``decoder_loss`` from one CUDA graph per batch shape, each recorded when its shape first
    comes; once ``max_graphs`` are recorded, or the graphs would hold more than ``memory_share``
    of the GPU's memory (``MEMORY_SHARE``), new shapes run eager.

    The parameters' gradients must live in buffers of their own (``materialize_grads``): a graph's
    backward returns its static buffers, and a parameter without a gradient would adopt one as its
    ``.grad``, which the next replay of that graph would overwrite.
    """

    def __init__(
        self,
        decoder: AttentionDecoder,
        max_graphs: int = MAX_GRAPHS,
        label_smoothing: float = 0.0,
        memory_share: float = MEMORY_SHARE,
        gpu_memory: CudaMemory | None = None,
    ) -> None:
        self.decoder = decoder
        self.label_smoothing = label_smoothing
        self.max_graphs = max_graphs
        self.memory_share = memory_share
        self.gpu_memory = gpu_memory or CudaMemory()
        self.graphs: dict[tuple[int, ...], Callable[..., Tensor]] = {}
        # The side stream every recording warms up on (made at the first, which needs CUDA).
        self.warmup_stream: torch.cuda.Stream | None = None
        self.recording_seconds = 0.0
        # What the recordings added to the allocator's reservation: in all, and the most one did.
        self.graph_bytes = 0
        self.largest_graph_bytes = 0
        # Why recording stopped (None while it goes on); then every new shape runs eager.
        self.stopped: str | None = None
        self.eager_batches = 0

    def __call__(
        self, tgt_in: Tensor, tgt_out: Tensor, memory: Tensor, src_lens: Tensor, *state: Tensor
    ) -> Tensor:
        shape = (*tgt_in.shape, memory.shape[1])  # (B, T, S)
        graphed = self.graphs.get(shape)
        if graphed is None:
            if self.stopped is None:
                self.stopped = self.reason_to_stop(tgt_in.device)
                if self.stopped is not None:
                    log.info("CUDA graphs: none recorded from now on: %s", self.stopped)
            if self.stopped is not None:
                self.eager_batches += 1
                return DecoderLoss(self.decoder, self.label_smoothing)(
                    tgt_in, tgt_out, memory, src_lens, *state
                )
            reserved = self.gpu_memory.reserved(tgt_in.device)
            graphed = self.graphs[shape] = self.record(tgt_in, tgt_out, memory, src_lens, *state)
            added = max(self.gpu_memory.reserved(tgt_in.device) - reserved, 0)
            self.graph_bytes += added
            self.largest_graph_bytes = max(self.largest_graph_bytes, added)
        return graphed(tgt_in, tgt_out, memory, src_lens, *state)

    def reason_to_stop(self, device: torch.device) -> str | None:
        """Why another graph should not be recorded (``MAX_GRAPHS``, ``MEMORY_SHARE``), or None."""
        if len(self.graphs) >= self.max_graphs:
            return f"the cap of {self.max_graphs} reached"
        free, total = self.gpu_memory.free_and_total(device)
        held, next_one = self.graph_bytes, self.largest_graph_bytes
        if held + next_one > self.memory_share * total:
            return (
                f"the {len(self.graphs)} recorded hold {held / 2**30:.1f} GiB, and one more would "
                f"pass {self.memory_share:.0%} of the GPU's {total / 2**30:.1f} GiB"
            )
        if free < 2 * next_one:
            return (
                f"{free / 2**30:.1f} GiB of the GPU is free, less than twice the largest "
                f"graph's {next_one / 2**30:.2f} GiB"
            )
        return None

    def record(self, *inputs: Tensor) -> Callable[..., Tensor]:
        """A graphed ``DecoderLoss`` for inputs of these shapes. Copies of ``inputs`` become its
        static input buffers, which every replay refills."""
        started = time.perf_counter()
        sample = tuple(
            tensor.detach().clone().requires_grad_(tensor.requires_grad) for tensor in inputs
        )
        # A module of its own per shape: make_graphed_callables replaces its forward.
        loss = DecoderLoss(self.decoder, self.label_smoothing)
        self.warm_up(loss, sample)
        # allow_unused_input: the bridge is the decoder's, but runs before DecoderLoss.
        graphed = torch.cuda.make_graphed_callables(
            loss, sample, num_warmup_iters=0, allow_unused_input=True
        )
        torch.cuda.synchronize()
        self.recording_seconds += time.perf_counter() - started
        return graphed  # type: ignore[return-value]

    def warm_up(self, loss: DecoderLoss, sample: tuple[Tensor, ...]) -> None:
        """``make_graphed_callables``'s warm-up, on one side stream for every recording: a few
        forward and backward passes (gradients returned, not accumulated), so that lazy
        initialisation and cuDNN's and cuBLAS's set-up happen before the recording.

        Its own warm-up takes a new stream at every call, and cuBLAS keeps a workspace per
        stream for the life of the process: about 57 MB per recorded shape on an H100, 1.2 GB
        of an epoch's 22 shapes on the reverse task, none of it used again.
        """
        if self.warmup_stream is None:
            self.warmup_stream = torch.cuda.Stream()
        wrt = [tensor for tensor in sample if tensor.requires_grad]
        wrt += [parameter for parameter in loss.parameters() if parameter.requires_grad]
        self.warmup_stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.warmup_stream):
            for _ in range(WARMUP_PASSES):
                torch.autograd.grad(loss(*sample), wrt, allow_unused=True)
        torch.cuda.current_stream().wait_stream(self.warmup_stream)

    def summary(self) -> str:
        text = (
            f"{len(self.graphs)} CUDA graphs recorded in {self.recording_seconds:.1f} s, holding "
            f"{self.graph_bytes / 2**30:.1f} GiB"
        )
        if self.eager_batches:
            text += f"; {self.eager_batches} batches of other shapes ran eager ({self.stopped})"
        return text


def materialize_grads(module: nn.Module) -> None:
    """Give every parameter a zero gradient buffer of its own (see ``DecoderGraphs``)."""
    for parameter in module.parameters():
        if parameter.requires_grad and parameter.grad is None:
            parameter.grad = torch.zeros_like(parameter)


def check_cuda_graphs(device: torch.device, world_size: int, precision: str) -> None:
    """One-paragraph errors for the setups ``cuda_graphs=true`` cannot train."""
    if device.type != "cuda":
        raise ConfigError(
            f"cuda_graphs=true records CUDA graphs, but training runs on {device.type}. Add "
            "trainer=gpu (and a CUDA build of torch), or drop cuda_graphs=true."
        )
    if world_size > 1:
        raise ConfigError(
            f"cuda_graphs=true trains on one GPU, and this run has {world_size} processes "
            "(recording graphs under DDP needs DDP's own warm-up and stream set-up, which this "
            "toolkit does not do). Use trainer.devices=1, or drop cuda_graphs=true."
        )
    if precision not in ("32", "32-true"):
        raise ConfigError(
            f"cuda_graphs=true needs trainer.precision=32-true, got {precision} (autocast caches "
            "casts across calls, which a replayed graph cannot see). Drop one of the two."
        )

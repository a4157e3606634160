"""Attention normalizers: the logits of one query's keys -> weights on the probability simplex.

Shape legend: B batch, Tq queries, Tk keys. Each normalizer maps logits (B, Tq, Tk) and a mask
``is_valid`` (B, Tq, Tk) bool (True: a real key the query may read; None: every key) to weights
(B, Tq, Tk), with the masking contract of ``seq2seq.attention.masked_softmax``: weight exactly 0.0
where ``is_valid`` is False, every row with a valid key sums to 1, a row with none is all zeros
(never NaN), computed in float32 (float64 stays float64) and cast back to the logits' dtype.

They are the members of one family, α-entmax (Peters, Niculae and Martins, 2019, eq. 9):

    entmax_α(z) = argmax_{p ∈ simplex} pᵀz + H_α(p),  with the solution
    p_i = [(α - 1) z_i - τ]_+ ^ (1 / (α - 1)),  τ the threshold that makes Σ p_i = 1.

- α → 1: ``softmax`` (Shannon entropy; never an exact zero);
- α = 2: ``sparsemax`` (Martins and Astudillo, 2016): p_i = [z_i - τ]_+, the Euclidean
  projection of z onto the simplex; τ in closed form after a sort (their Algorithm 1);
- α = 1.5: ``entmax15``: p_i = [z_i / 2 - τ]_+², τ in closed form after a sort (Peters et al.,
  2019, Algorithm 2);
- any α > 1: ``entmax_bisect``, τ by bisection (Blondel et al., 2019; Correia et al., 2019, who
  also learn α, one per attention head there, one per attention here).

Exact zeros are the point: a sparse row says "this query reads only these keys", which is what
alignment error rate measures. Every α > 1 shares one Jacobian (Peters et al., 2019, Prop. 2),

    ∂p/∂z = diag(s) - s sᵀ / Σ s,  s_i = p_i^(2 - α) where p_i > 0, else 0,

which the backward passes below use instead of differentiating through the sort or the bisection
(softmax is its α = 1 case: s = p). The ``entmax`` package (deep-spin) implements the same
functions; ours take the padding mask as an argument, because that package's functions return
NaN when padded keys are masked with -inf (its issue 17); the tests hold ours to it on valid keys.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seq2seq.errors import ConfigError

# The built-in normalizers, by the name ``attention.normalizer`` gives them.
NORMALIZERS = ("softmax", "sparsemax", "entmax15", "entmax")
LEARNABLE = "learnable"
# Bisection halves τ's interval (at most 1 wide) per iteration: 2^-50 is below float64's epsilon.
BISECTION_ITERATIONS = 50


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for 16-bit logits (and float32), float64 for float64 (gradcheck's precision)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def softmax(logits: Tensor, is_valid: Tensor | None) -> Tensor:
    """exp(z_i) / Σ_j exp(z_j) over the valid keys of each row; see the module docstring."""
    z = logits.to(compute_dtype(logits.dtype))
    if is_valid is None:
        return F.softmax(z, dim=-1).to(logits.dtype)
    # The most negative finite number, not -inf: a row with no valid key stays finite (uniform
    # before the multiplication below) instead of computing -inf - -inf = NaN.
    filled = z.masked_fill(~is_valid, torch.finfo(z.dtype).min)  # (B, Tq, Tk)
    return (F.softmax(filled, dim=-1) * is_valid).to(logits.dtype)  # exact zeros at padding


def sorted_valid_logits(logits: Tensor, is_valid: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    """What the closed-form thresholds read: the logits in the compute dtype, shifted so that
    each row's largest valid logit is 0 (the thresholds are shift-invariant; this keeps squares
    small), with every padded key put 1 below the row's smallest valid one, so that they sort
    last; those shifted logits z (B, Tq, Tk), their descending sort (B, Tq, Tk), and the number
    of valid keys of each row (B, Tq, 1), which the support never exceeds.

    Finite everywhere: no -inf enters the sums (the failure of the entmax package's issue 17)."""
    z = logits.to(compute_dtype(logits.dtype))
    if is_valid is None:
        z = z - z.amax(dim=-1, keepdim=True)
        count = torch.full_like(z[..., :1], z.shape[-1], dtype=torch.long)
        return z, z.sort(dim=-1, descending=True).values, count
    largest = torch.finfo(z.dtype).max
    top = z.masked_fill(~is_valid, -largest).amax(dim=-1, keepdim=True)  # (B, Tq, 1)
    bottom = z.masked_fill(~is_valid, largest).amin(dim=-1, keepdim=True)  # (B, Tq, 1)
    count = is_valid.sum(dim=-1, keepdim=True)  # (B, Tq, 1)
    # A row without a valid key: any finite values (its weights are zeroed at the end).
    has_key = count > 0
    top, bottom = torch.where(has_key, top, 0.0), torch.where(has_key, bottom, 0.0)
    z = torch.where(is_valid, z - top, bottom - top - 1.0)  # (B, Tq, Tk)
    return z, z.sort(dim=-1, descending=True).values, count


def ranks_like(sorted_z: Tensor) -> Tensor:
    """k = 1, 2, ..., Tk along the last axis, in the dtype of ``sorted_z``: (Tk,)."""
    return torch.arange(1, sorted_z.shape[-1] + 1, device=sorted_z.device, dtype=sorted_z.dtype)


def support_size(in_support: Tensor, count: Tensor) -> Tensor:
    """How many of the largest logits are in the support (B, Tq, 1), from the support condition
    at each rank k (B, Tq, Tk), never past the valid keys (and at least 1, for empty rows)."""
    ranks = torch.arange(1, in_support.shape[-1] + 1, device=in_support.device)
    size = (in_support & (ranks <= count)).sum(dim=-1, keepdim=True)
    return size.clamp(min=1)


class _Entmax(torch.autograd.Function):
    """α-entmax for a fixed α: ``solve`` computes the weights (without autograd, as a Function's
    forward runs), the backward multiplies by the Jacobian diag(s) - s sᵀ / Σ s with
    s = p^(2 - α) on the support (module docstring), the one backward of every α > 1."""

    @staticmethod
    def forward(
        ctx: Any,
        logits: Tensor,
        is_valid: Tensor | None,
        alpha: float,
        solve: Callable[[Tensor, Tensor | None], Tensor],
    ) -> Tensor:
        weights = solve(logits, is_valid)
        ctx.save_for_backward(weights)
        ctx.alpha = alpha
        return weights

    @staticmethod
    def backward(ctx: Any, grad_weights: Tensor) -> tuple[Tensor, None, None, None]:
        (weights,) = ctx.saved_tensors
        s = jacobian_weights(weights, ctx.alpha)  # (B, Tq, Tk)
        return entmax_backward(grad_weights, s).to(grad_weights.dtype), None, None, None


def jacobian_weights(weights: Tensor, alpha: float | Tensor) -> Tensor:
    """s = p^(2 - α) where p > 0, else 0, in the compute dtype: (B, Tq, Tk)."""
    p = weights.to(compute_dtype(weights.dtype))
    positive = p > 0
    if isinstance(alpha, float) and alpha == 2.0:
        return positive.to(p.dtype)  # sparsemax: 1 on the support
    return torch.where(positive, p.clamp(min=torch.finfo(p.dtype).tiny) ** (2 - alpha), 0.0)


def entmax_backward(grad_weights: Tensor, s: Tensor) -> Tensor:
    """(diag(s) - s sᵀ / Σ s) g for each row: the gradient with respect to the logits, (B, Tq, Tk).
    A row without support (no valid key) has s = 0 and gets no gradient."""
    grad = grad_weights.to(s.dtype) * s
    total = s.sum(dim=-1, keepdim=True).clamp(min=torch.finfo(s.dtype).tiny)
    return grad - s * grad.sum(dim=-1, keepdim=True) / total


def sparsemax(logits: Tensor, is_valid: Tensor | None) -> Tensor:
    """p_i = [z_i - τ]_+ (Martins and Astudillo, 2016, Algorithm 1): with z sorted descending,
    the support is the k largest for the largest k with 1 + k z_(k) > Σ_{j<=k} z_(j), and
    τ = (Σ_{j<=k} z_(j) - 1) / k."""
    return _Entmax.apply(logits, is_valid, 2.0, _sparsemax_weights)


def _sparsemax_weights(logits: Tensor, is_valid: Tensor | None) -> Tensor:
    z, sorted_z, count = sorted_valid_logits(logits, is_valid)
    cumulative = sorted_z.cumsum(dim=-1)  # (B, Tq, Tk)
    size = support_size(1 + ranks_like(sorted_z) * sorted_z > cumulative, count)
    tau = (cumulative.gather(-1, size - 1) - 1) / size  # (B, Tq, 1)
    return _masked(z - tau, is_valid).to(logits.dtype)


def _masked(above_threshold: Tensor, is_valid: Tensor | None) -> Tensor:
    """[x]_+, exactly 0 where no key may be read."""
    weights = above_threshold.clamp(min=0)
    return weights if is_valid is None else weights * is_valid


def entmax15(logits: Tensor, is_valid: Tensor | None) -> Tensor:
    """p_i = [z_i / 2 - τ]_+² (Peters, Niculae and Martins, 2019, Algorithm 2): with x = z / 2
    sorted descending, for each k the τ that would make the k largest sum to 1 is
    τ_k = mean_k - sqrt((1 - k (meansq_k - mean_k²)) / k); the support is the largest k with
    τ_k <= x_(k)."""
    return _Entmax.apply(logits, is_valid, 1.5, _entmax15_weights)


def _entmax15_weights(logits: Tensor, is_valid: Tensor | None) -> Tensor:
    z, sorted_z, count = sorted_valid_logits(logits, is_valid)
    x, sorted_x = z / 2, sorted_z / 2
    ranks = ranks_like(sorted_x)
    mean = sorted_x.cumsum(dim=-1) / ranks  # (B, Tq, Tk)
    mean_square = sorted_x.square().cumsum(dim=-1) / ranks
    spread = ranks * (mean_square - mean.square())
    # Clamped at 0: a k whose discriminant is negative is past the support anyway.
    tau_k = mean - ((1 - spread) / ranks).clamp(min=0).sqrt()  # (B, Tq, Tk)
    size = support_size(tau_k <= sorted_x, count)
    tau = tau_k.gather(-1, size - 1)  # (B, Tq, 1)
    return _masked(x - tau, is_valid).square().to(logits.dtype)


def entmax_bisect(
    logits: Tensor,
    is_valid: Tensor | None,
    alpha: float | Tensor,
    iterations: int = BISECTION_ITERATIONS,
) -> Tensor:
    """α-entmax for any α > 1 (a float, or a 0-d tensor that may require a gradient), τ by
    bisection: Σ_i [(α - 1) z_i - τ]_+^(1/(α-1)) falls as τ rises, from >= 1 at
    τ = max (α - 1) z - 1 to <= 1 at τ = max (α - 1) z - n^(1-α) (n valid keys)."""
    if isinstance(alpha, Tensor):
        # No check on its value: reading it would stop a traced graph (torch.export) at a
        # data-dependent branch; ``Entmax`` keeps a learned α above 1 by construction.
        return _EntmaxLearnedAlpha.apply(logits, is_valid, alpha, iterations)
    if not alpha > 1:
        raise ValueError(f"entmax_bisect needs alpha > 1 (alpha = 1 is softmax), got {alpha}.")

    def solve(z: Tensor, valid: Tensor | None) -> Tensor:
        return _bisect_weights(z, valid, alpha, iterations)

    return _Entmax.apply(logits, is_valid, float(alpha), solve)


def _bisect_weights(
    logits: Tensor, is_valid: Tensor | None, alpha: float | Tensor, iterations: int
) -> Tensor:
    """The bisection's weights; α a float or a 0-d tensor (a learned α: tensor arithmetic only,
    so that an exported graph computes with the stored value)."""
    z, _, count = sorted_valid_logits(logits, is_valid)  # each row's largest valid logit is 0
    x = z * (alpha - 1)  # (B, Tq, Tk)
    exponent = 1 / (alpha - 1)
    low = torch.full_like(x[..., :1], -1.0)  # a τ where the sum is >= 1: (B, Tq, 1)
    width = 1 - count.clamp(min=1).to(x.dtype) ** (1 - alpha)  # to a τ where it is <= 1
    for _ in range(iterations):
        width = width / 2
        middle = low + width
        weights = _masked(x - middle, is_valid) ** exponent
        low = torch.where(weights.sum(dim=-1, keepdim=True) >= 1, middle, low)
    weights = _masked(x - low, is_valid) ** exponent
    # The bisection's last error, spread over the support: rows sum to 1 exactly.
    weights = weights / weights.sum(dim=-1, keepdim=True).clamp(min=torch.finfo(x.dtype).tiny)
    return weights.to(logits.dtype)


class _EntmaxLearnedAlpha(torch.autograd.Function):
    """α-entmax by bisection at a learned α (0-d tensor): the gradient with respect to the logits
    (the Jacobian above) and to α (Correia, Niculae and Martins, 2019, Proposition 1):

        ∂p_i/∂α = (p_i - s̃_i) / (α - 1)² - (h_i - s̃_i Σ_j h_j) / (α - 1),
        s̃ = s / Σ s,  h_i = p_i log p_i (0 where p_i = 0)."""

    @staticmethod
    def forward(
        ctx: Any, logits: Tensor, is_valid: Tensor | None, alpha: Tensor, iterations: int
    ) -> Tensor:
        weights = _bisect_weights(logits, is_valid, alpha.to(logits.dtype), iterations)
        ctx.save_for_backward(weights, alpha)
        return weights

    @staticmethod
    def backward(ctx: Any, grad_weights: Tensor) -> tuple[Tensor, None, Tensor, None]:
        weights, alpha = ctx.saved_tensors
        p = weights.to(compute_dtype(weights.dtype))
        a = alpha.to(p.dtype)
        s = jacobian_weights(weights, a)
        grad_logits = entmax_backward(grad_weights, s)
        grad = grad_weights.to(p.dtype)
        skewed = s / s.sum(dim=-1, keepdim=True).clamp(min=torch.finfo(p.dtype).tiny)
        plogp = torch.special.xlogy(p, p)
        d_alpha = (p - skewed) / (a - 1) ** 2 - (
            plogp - skewed * plogp.sum(dim=-1, keepdim=True)
        ) / (a - 1)
        grad_alpha = (grad * d_alpha).sum().to(alpha.dtype)
        return grad_logits.to(grad_weights.dtype), None, grad_alpha, None


# What a normalizer is to the attention: (logits (B, Tq, Tk), is_valid (B, Tq, Tk) or None) ->
# weights (B, Tq, Tk). A user's may be a function or an nn.Module.
NormalizerFunction = Callable[[Tensor, Tensor | None], Tensor]


class Softmax(nn.Module):
    """The default: ``softmax`` over the valid keys."""

    alpha = 1.0

    def forward(self, logits: Tensor, is_valid: Tensor | None) -> Tensor:
        return softmax(logits, is_valid)


class Sparsemax(nn.Module):
    """``sparsemax``: α = 2, exact zeros for keys below the threshold."""

    alpha = 2.0

    def forward(self, logits: Tensor, is_valid: Tensor | None) -> Tensor:
        return sparsemax(logits, is_valid)


class Entmax15(nn.Module):
    """``entmax15``: α = 1.5, sparse but smoother than sparsemax."""

    alpha = 1.5

    def forward(self, logits: Tensor, is_valid: Tensor | None) -> Tensor:
        return entmax15(logits, is_valid)


class Entmax(nn.Module):
    """``entmax_bisect`` at a fixed α > 1, or, with ``alpha="learnable"``, at a learned one that
    starts at ``initial_alpha``: stored as ρ with α = 1 + softplus(ρ), so that it stays above 1
    (where α-entmax is defined) as it learns."""

    def __init__(self, alpha: float | str | None = 1.5, initial_alpha: float = 1.5) -> None:
        super().__init__()
        self.raw_alpha: nn.Parameter | None = None
        self.fixed_alpha = 1.5
        start = check_alpha(initial_alpha, "initial_alpha")
        if alpha == LEARNABLE:
            # softplus⁻¹(y) = log(exp(y) - 1) = y + log(1 - exp(-y)), y = α - 1: the second form
            # does not overflow for a large start.
            raw = (start - 1) + math.log(-math.expm1(-(start - 1)))
            self.raw_alpha = nn.Parameter(torch.tensor(raw))
        else:
            self.fixed_alpha = 1.5 if alpha is None else check_alpha(alpha, "alpha")
            if start != 1.5:
                fixed = "null (1.5)" if alpha is None else repr(alpha)
                raise ConfigError(
                    f"attention.initial_alpha={initial_alpha!r} is where a learned α starts, but "
                    f"attention.alpha={fixed} is fixed. Use attention.alpha={LEARNABLE} "
                    f"attention.initial_alpha={initial_alpha!r}, or set the fixed value with "
                    f"attention.alpha={initial_alpha!r}."
                )

    @property
    def alpha(self) -> Tensor | float:
        """α: a 0-d tensor when learnable (gradients flow into it), else a float."""
        if self.raw_alpha is not None:
            return 1 + F.softplus(self.raw_alpha)
        return self.fixed_alpha

    def extra_repr(self) -> str:
        return "alpha=learnable" if self.raw_alpha is not None else f"alpha={self.fixed_alpha}"

    def forward(self, logits: Tensor, is_valid: Tensor | None) -> Tensor:
        return entmax_bisect(logits, is_valid, self.alpha)


class UserNormalizer(nn.Module):
    """A user's normalizer (a function, or a module, named by ``attention.normalizer._target_``)
    held to the masking contract: it sees logits in float32 (float64 stays), its weights are
    zeroed where no key may be read and cast back to the logits' dtype. A module's parameters
    are this module's (``function``), so they train and are saved like any other."""

    def __init__(self, function: NormalizerFunction) -> None:
        super().__init__()
        self.function = function

    def forward(self, logits: Tensor, is_valid: Tensor | None) -> Tensor:
        weights = self.function(logits.to(compute_dtype(logits.dtype)), is_valid)
        if is_valid is not None:
            weights = weights * is_valid
        return weights.to(logits.dtype)


def build_normalizer(
    normalizer: str | NormalizerFunction | nn.Module,
    alpha: float | str | None = None,
    initial_alpha: float | None = None,
) -> nn.Module:
    """The normalizer ``attention.normalizer`` names (one of ``NORMALIZERS``), or a user's
    callable, with ``attention.alpha`` / ``attention.initial_alpha`` for ``entmax``."""
    if not isinstance(normalizer, str):
        if alpha is not None or initial_alpha is not None:
            raise ConfigError(_alpha_elsewhere("your own normalizer"))
        if not callable(normalizer):
            raise ConfigError(
                f"attention.normalizer must be one of {', '.join(NORMALIZERS)} or your own "
                f"function or module (named by _target_), got {normalizer!r}."
            )
        # A module is copied: each attention gets its own parameters, as with a built-in one.
        own = copy.deepcopy(normalizer) if isinstance(normalizer, nn.Module) else normalizer
        return check_users_normalizer(UserNormalizer(own))
    if normalizer == "entmax":
        return Entmax(alpha, 1.5 if initial_alpha is None else initial_alpha)
    if alpha is not None or initial_alpha is not None:
        raise ConfigError(_alpha_elsewhere(f"attention.normalizer={normalizer}"))
    builtin: dict[str, type[nn.Module]] = {
        "softmax": Softmax, "sparsemax": Sparsemax, "entmax15": Entmax15,
    }  # fmt: skip
    if normalizer not in builtin:
        raise ConfigError(
            f"attention.normalizer={normalizer!r} is not a normalizer: use softmax (the "
            "default), sparsemax (α = 2, exact zeros), entmax15 (α = 1.5) or entmax (any α > 1, "
            "attention.alpha=2.5 or attention.alpha=learnable), or your own function: "
            "attention.normalizer={_target_: mymodule.my_normalizer, _partial_: true}."
        )
    return builtin[normalizer]()


# What a user's normalizer must be: called as normalizer(logits, is_valid).
USERS_SIGNATURE = (
    "a function (named with _partial_: true) or an nn.Module class (without _partial_) whose "
    "call normalizer(logits (B, Tq, Tk), is_valid (B, Tq, Tk) bool or None) returns weights of "
    "the logits' shape, each valid row on the simplex"
)


def check_users_normalizer(normalizer: UserNormalizer) -> UserNormalizer:
    """Try a user's normalizer once on small logits, a padded row and an empty one, before any
    training: a wrong signature, shape or NaN is one paragraph here, not a traceback later."""
    logits = torch.tensor([[[2.0, 0.5, -1.0], [0.3, 0.1, 9.0], [0.0, 0.0, 0.0]]])  # (1, 3, 3)
    is_valid = torch.tensor([[[True, True, True], [True, True, False], [False, False, False]]])
    function = normalizer.function
    named = getattr(function, "func", function)  # a partial's function
    name = getattr(named, "__name__", type(named).__name__)
    try:
        with torch.no_grad():
            weights = function(logits, is_valid)  # before our masking, which broadcasts
    except Exception as error:  # the user's code: any failure is theirs to fix
        raise ConfigError(
            f"attention.normalizer: calling your normalizer {name} failed ({type(error).__name__}: "
            f"{error}). It must be {USERS_SIGNATURE}."
        ) from None
    if not isinstance(weights, Tensor) or weights.shape != logits.shape:
        shape = tuple(weights.shape) if isinstance(weights, Tensor) else type(weights).__name__
        raise ConfigError(
            f"attention.normalizer: your normalizer {name} returned {shape} for logits of shape "
            f"{tuple(logits.shape)}. It must be {USERS_SIGNATURE}."
        )
    if not torch.isfinite(weights).all():
        raise ConfigError(
            f"attention.normalizer: your normalizer {name} returned NaN or infinite weights for "
            "finite logits (with a padded row and a row without a valid key: weights 0 there, "
            f"not 0/0). It must be {USERS_SIGNATURE}."
        )
    return normalizer


def check_alpha(alpha: object, key: str) -> float:
    """``attention.<key>`` as a float > 1, or a ConfigError that says what is allowed."""
    if (
        isinstance(alpha, bool)
        or not isinstance(alpha, int | float)
        or not (math.isfinite(alpha) and alpha > 1)
    ):
        allowed = (
            f"a number above 1 (1.5 is entmax15, 2 is sparsemax; α → 1 approaches softmax) or "
            f"'{LEARNABLE}' (learned with the model, starting at attention.initial_alpha)"
            if key == "alpha"
            else "a number above 1 (where attention.alpha=learnable starts)"
        )
        raise ConfigError(
            f"attention.{key} must be {allowed}, got {alpha!r}. E.g. seq2seq train "
            f"attention.normalizer=entmax attention.alpha={LEARNABLE} attention.initial_alpha=1.5."
        )
    return float(alpha)


def _alpha_elsewhere(normalizer: str) -> str:
    return (
        f"attention.alpha and attention.initial_alpha set α-entmax's α, but {normalizer} has no "
        "α to set. Use attention.normalizer=entmax with them (e.g. attention.normalizer=entmax "
        "attention.alpha=1.3), or leave them null."
    )


def is_softmax(normalizer: nn.Module | None) -> bool:
    """Whether ``normalizer`` is the default (what the fast paths compute)."""
    return normalizer is None or type(normalizer) is Softmax

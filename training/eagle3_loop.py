"""The EAGLE-3 training loss (SafeAILab/EAGLE eagle/traineagle3: cnets.py Model.forward, main.py weights).

Per sequence (T tokens) index t pairs the fused captured features a_t with token x_{t+1}; TTT step k (0-based)
at index t sees token x_{t+1+k} (teacher forcing, cnets `padding(input_ids, left=False)` once per step) and
predicts the target's next-token distribution after position t+1+k:

    p_k(t)  = softmax(hidden_{t+1+k} @ lm_head[draft_ids].T)         target logits restricted to the draft vocab
    ce_k    = -sum_t keep_k(t) * sum_v p_k(t)_v * log_softmax(draft_logits_k(t))_v / n_k
    loss    = p_weight * sum_k step_decay**k * ce_k                     (main.py: 0.8**k)

over the n_k loss positions of step k (x_{t+1+k} is an answer token, as EAGLE-1's collate; so every step covers
the same answer positions, step k from roots k positions earlier); keep_k(t) = the target's greedy token
(argmax over the FULL vocabulary) is in the draft vocabulary (cnets `position_mask`). Upstream divides by all B*T
positions instead of n_k (a per-batch constant factor); dividing by n_k makes the loss independent of padding.
acc_k = fraction of those positions where the draft's argmax, mapped to a target id, is the target's greedy token
(cnets `acces`, same denominator). With train.p_loss_positions > 0 each step's loss and accuracy use a random
subset of that many positions per sequence (an unbiased estimate; the lm_head over the draft vocabulary is the
dominant CPU cost). No feature loss and no noise (upstream has neither; the config refuses them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from training.config import TrainConfig
from training.eagle3_model import Eagle3Head
from training.plan import Positions, plan_positions, position_mask


@dataclass
class Example3:
    aux: torch.Tensor  # [T, n*H] float16, captured target layer inputs
    hidden: torch.Tensor  # [T, H] float16, post-norm last hidden states
    greedy: torch.Tensor  # [T] int, target's greedy next token at each position
    input_ids: torch.Tensor  # [T] int
    loss_mask: torch.Tensor  # [T] bool, True on answer tokens


@dataclass
class Batch3:
    aux: torch.Tensor  # [B, L, n*H] a_t for t < L = longest T - 1
    tokens: torch.Tensor  # [B, L+S] x_{t+1}
    hidden_next: torch.Tensor  # [B, L+S, H] hidden_{t+1}
    greedy_next: torch.Tensor  # [B, L+S] greedy_{t+1}
    valid: torch.Tensor  # [B, L+S] position t+1 exists
    lmask: torch.Tensor  # [B, L+S] valid and x_{t+1} is an answer token

    @property
    def length(self) -> int:
        return self.aux.shape[1]

    def at(self, name: str, k: int) -> torch.Tensor:
        """Field `name` shifted for TTT step k: index t holds position t+1+k."""
        return getattr(self, name)[:, k : k + self.length]


def collate3(examples: list[Example3], steps: int, device: torch.device | str = "cpu") -> Batch3:
    """Right-pad to the longest; the next-position fields get `steps` extra (padded, invalid) columns."""
    L = max(len(e.input_ids) - 1 for e in examples)
    b, H, A = len(examples), examples[0].hidden.shape[1], examples[0].aux.shape[1]
    out = Batch3(torch.zeros(b, L, A), torch.zeros(b, L + steps, dtype=torch.long), torch.zeros(b, L + steps, H),
                 torch.zeros(b, L + steps, dtype=torch.long), torch.zeros(b, L + steps, dtype=torch.bool),
                 torch.zeros(b, L + steps, dtype=torch.bool))
    for i, e in enumerate(examples):
        n = len(e.input_ids) - 1
        out.aux[i, :n] = e.aux[:-1].float()
        out.tokens[i, :n] = e.input_ids[1:].long()
        out.hidden_next[i, :n] = e.hidden[1:].float()
        out.greedy_next[i, :n] = e.greedy[1:].long()
        out.valid[i, :n] = True
        out.lmask[i, :n] = e.loss_mask[1:]
    return Batch3(*(getattr(out, f).to(device, non_blocking=True) for f in ("aux", "tokens", "hidden_next",
                                                                         "greedy_next", "valid", "lmask")))


def teacher_tokens(batch: Batch3) -> Callable[[int, torch.Tensor | None], torch.Tensor]:
    return lambda k, _prev: batch.at("tokens", k)


def eagle3_loss(
    head: Eagle3Head, lm_sub: torch.Tensor, batch: Batch3, steps: int, decay: float, tc: TrainConfig,
    plans: list[Positions], n_ce: list[int],
) -> tuple[torch.Tensor, dict[str, float]]:
    """This batch's share of the TTT loss (module docstring). lm_sub = the target's lm_head rows of the draft ids
    [N, H]; plans[k] = this batch's cross-entropy positions of step k, n_ce[k] = their count over the whole global
    batch (the normalizer, so the ranks' shares sum to the loss). Metric shares sum over ranks likewise."""
    outs = head.unroll(batch.aux, steps, teacher_tokens(batch))
    total = torch.zeros((), device=batch.aux.device)
    m: dict[str, float] = {}
    for k, out in enumerate(outs):
        mask = position_mask(plans[k].ce, batch.length).to(out.device)
        sel, hid, greedy = out[mask].float(), batch.at("hidden_next", k)[mask], batch.at("greedy_next", k)[mask]
        n = max(n_ce[k], 1)
        with torch.no_grad():
            target_p = (hid @ lm_sub.T).float().softmax(-1)
            in_vocab = head.t2d[greedy]
        logp = head.logits(sel).float().log_softmax(-1)
        ce = -(target_p * logp).sum(-1).masked_fill(~in_vocab, 0.0).sum() / n
        total = total + decay**k * ce
        m[f"ploss_{k}"] = ce.item()
        m[f"acc_{k}"] = (head.draft_to_target(logp.argmax(-1)) == greedy).float().sum().item() / n
        m[f"tokens_{k}"] = int(sel.shape[0])
    loss = tc.p_weight * total
    return loss, {"loss": loss.item(), **m}


def empty_metrics3(steps: int) -> dict[str, float]:
    """The metric shares of a rank with no example in the batch."""
    return {"loss": 0.0, **{f"{name}_{k}": 0.0 for k in range(steps) for name in ("ploss", "acc", "tokens")}}


def plan3(masks: list[torch.Tensor], steps: int, keep: int, gen: torch.Generator | None) -> list[Positions]:
    """Cross-entropy positions of every TTT step k (shift k), drawn in step order from one generator."""
    return [plan_positions(masks, keep, gen, shift=k) for k in range(steps)]


@torch.no_grad()
def chain_accept3(head: Eagle3Head, examples: list[Example3], depth: int) -> dict[str, float]:
    """Greedy CHAIN drafting from every answer root at once (TTT attention = the draft KV cache): step k feeds the
    head's own step k-1 draft; it is accepted when it equals the target's greedy token after position t+1+k and
    all earlier steps were (SafeAILab getkacc). chain_tau = 1 + mean accepted drafts (bonus token included)."""
    accepted_all = []
    dev = head.lm_head.weight.device
    for e in examples:
        batch = collate3([e], depth, dev)

        def tokens(k: int, prev: torch.Tensor | None, batch: Batch3 = batch) -> torch.Tensor:
            if prev is None:
                return batch.at("tokens", 0)
            return head.draft_to_target(head.logits(prev).argmax(-1))

        outs = head.unroll(batch.aux, depth, tokens)
        alive = torch.ones(batch.length, dtype=torch.bool, device=dev)
        accepted = torch.zeros(batch.length, dtype=torch.long, device=dev)
        for k, out in enumerate(outs):
            draft = head.draft_to_target(head.logits(out).argmax(-1))[0]
            alive &= batch.at("valid", k)[0] & (draft == batch.at("greedy_next", k)[0])
            accepted += alive.long()
        accepted_all.append(accepted[batch.at("lmask", 0)[0]].cpu())
    acc = torch.cat(accepted_all) if accepted_all else torch.zeros(0, dtype=torch.long)
    if acc.numel() == 0:
        return {"chain_tau": float("nan")}
    figures = {"chain_tau": 1.0 + acc.float().mean().item()}
    for m in range(1, depth + 1):  # P(step m accepted | steps < m accepted)
        figures[f"chain_p{m}"] = (acc >= m).sum().item() / max((acc >= m - 1).sum().item(), 1)
    return figures

"""optimizer muon: which parameter goes to Muon and which to AdamW (babygpt/optim.py), Muon's update
against torch.optim.Muon built by hand, the schedule on both groups, the loss scaler, QK-Clip's call
site, and the one-line refusals. Exact resume under Muon: tests/test_reliability.py and test_half.py;
under torchrun: tests/test_distributed.py."""

import json

import pytest
import torch
import torch.nn as nn
from torch.testing import assert_close

from babygpt import cli
from babygpt.checkpoint import FIXED_AT_START, check_same_start, load_optimizer_state
from babygpt.config import TrainConfig, load_config
from babygpt.errors import BabyGPTError
from babygpt.model import GPT, GPTConfig
from babygpt.optim import MuonNS, MuonWithAdamW, build_optimizer, hidden_matrices, newton_schulz
from babygpt.placements import PLACEMENTS as PLACEMENT_CLASSES
from babygpt.trainer import Trainer, lr_at
from conftest import GRID, GRID_IDS, NaNAfter, TINY_TRAIN_ARGS, assert_refused_in_process, once, tiny_config

MUON = TrainConfig(optimizer="muon")


def expected_routes(model: GPT) -> dict[str, set[int]]:
    """What each parameter is, read off the modules rather than the shapes: Muon gets the weight of
    every Linear inside the blocks; AdamW decays the embeddings (and the head tied to the token
    embedding); everything else (norm gains and biases, Linear biases, gates, scales) is AdamW's,
    undecayed."""
    muon = {id(m.weight) for m in model.blocks.modules() if isinstance(m, nn.Linear)}
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    rest = {id(p) for p in model.parameters()} - muon - embeddings
    return {"muon": muon, "decay": embeddings, "no_decay": rest}


def actual_routes(opt: MuonWithAdamW) -> dict[str, list[int]]:
    decay, no_decay = opt.adamw.param_groups
    return {"muon": [id(p) for g in opt.muon.param_groups for p in g["params"]],
            "decay": [id(p) for p in decay["params"]], "no_decay": [id(p) for p in no_decay["params"]]}


def assert_routed(model: GPT) -> None:
    opt = build_optimizer(model, MUON)
    routes, expected = actual_routes(opt), expected_routes(model)
    every = [i for ids in routes.values() for i in ids]
    assert sorted(every) == sorted(id(p) for p in model.parameters())  # each parameter in exactly one group
    for name, ids in routes.items():
        assert set(ids) == expected[name], name
    assert id(model.lm_head.weight) in routes["decay"]  # the head, tied to the token embedding: AdamW
    decay, no_decay = opt.adamw.param_groups
    assert (decay["weight_decay"], no_decay["weight_decay"]) == (MUON.weight_decay, 0.0)


# ------------------------------------------------------------------ routing

@pytest.mark.parametrize("placement,norm", GRID, ids=GRID_IDS)
def test_each_parameter_goes_to_one_optimizer_for_every_norm_and_placement(placement, norm):
    assert_routed(GPT(tiny_config(norm_placement=placement, norm_type=norm)))


@pytest.mark.parametrize("extra", [
    dict(split_qkv=True, mlp="swiglu", pos="rope"),
    dict(qk_norm=True, qk_scale="per_head", emb_scale_learnable=True, residual_lambdas=True),
    dict(norm_placement="pre", norm_type="rmsnorm", bias=False, final_norm=True, emb_norm=True),
], ids=["split-swiglu-rope", "qk-scales-gates", "rms-no-bias"])
def test_routing_of_the_modern_block_options(extra):
    assert_routed(GPT(tiny_config(**extra)))


def test_hidden_matrices_are_the_blocks_two_dimensional_parameters():
    model = GPT(tiny_config())
    names = {id(p): n for n, p in model.named_parameters()}
    assert sorted(names[id(p)] for p in hidden_matrices(model)) == sorted(
        n for n, p in model.named_parameters() if n.startswith("blocks.") and p.dim() == 2)
    assert all(not names[id(p)].startswith(("tok_emb", "pos_emb", "lm_head")) for p in hidden_matrices(model))


def test_adamw_is_configure_optimizers_unchanged():
    """optimizer adamw builds exactly today's AdamW: the same groups, the same settings, lr_scale 1."""
    cfg = TrainConfig()
    model = GPT(tiny_config())
    built = build_optimizer(model, cfg)
    today = model.configure_optimizers(cfg.weight_decay, cfg.learning_rate, (cfg.beta1, cfg.beta2), eps=cfg.adam_eps)
    assert type(built) is torch.optim.AdamW
    for got, want in zip(built.param_groups, today.param_groups, strict=True):
        assert [id(p) for p in got["params"]] == [id(p) for p in want["params"]]
        assert {k: v for k, v in got.items() if k not in ("params", "lr_scale")} == \
            {k: v for k, v in want.items() if k != "params"}
        assert got["lr_scale"] == 1.0


# ------------------------------------------------------------------ the update

def random_grads(model: GPT, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(p.shape, generator=g) for p in model.parameters()]


def set_grads(params, grads) -> None:
    for p, grad in zip(params, grads):
        p.grad = grad.clone()


@pytest.mark.parametrize("adjust", ["original", "match_rms_adamw"])
def test_muon_and_adamw_steps_equal_the_torch_optimizers_built_by_hand(adjust):
    """Two steps (the second uses the momentum) on random gradients: the routed Muon parameters move
    exactly as a torch.optim.Muon over copies of them, the others as a torch.optim.AdamW."""
    cfg = TrainConfig(optimizer="muon", muon_adjust_lr=adjust, muon_momentum=0.9, weight_decay=0.05)
    model = GPT(tiny_config())
    opt = build_optimizer(model, cfg)
    hidden = {id(p) for p in hidden_matrices(model)}
    copies = {id(p): p.detach().clone().requires_grad_() for p in model.parameters()}
    muon_ref = torch.optim.Muon([copies[i] for i in hidden], lr=cfg.muon_lr, weight_decay=cfg.weight_decay,
                                momentum=0.9, nesterov=True, adjust_lr_fn=adjust)
    decay, no_decay = ([copies[id(p)] for p in g["params"]] for g in opt.adamw.param_groups)
    adamw_ref = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=cfg.learning_rate, betas=(cfg.beta1, cfg.beta2), eps=cfg.adam_eps)
    initial = [p.detach().clone() for p in model.parameters()]
    for seed in (1, 2):
        grads = random_grads(model, seed)
        set_grads(model.parameters(), grads)
        set_grads([copies[id(p)] for p in model.parameters()], grads)
        opt.step()
        muon_ref.step()
        adamw_ref.step()
    for (name, p), start in zip(model.named_parameters(), initial):
        assert_close(p.detach(), copies[id(p)].detach(), rtol=0, atol=0, msg=name)
        assert not torch.equal(p, start), name


def matrices(seed: int) -> list[torch.Tensor]:
    """A wide, a tall and a square matrix: both sides of the Gram-matrix choice."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g) for shape in ((8, 24), (24, 8), (16, 16))]


@pytest.mark.parametrize("iteration", [{}, {"ns_steps": 3, "ns_coefficients": (2.0, -1.5, 0.5)}],
                         ids=["torch's", "other steps and coefficients"])
@pytest.mark.parametrize("nesterov", [True, False])
@pytest.mark.parametrize("adjust", ["original", "match_rms_adamw"])
def test_muon_ns_in_bfloat16_is_torch_optim_muon_bit_for_bit(adjust, nesterov, iteration):
    """MuonNS writes Muon's step out so that its iteration's dtype can change; in bfloat16, torch's
    dtype, three steps move every matrix exactly as torch.optim.Muon does, and leave the same state,
    also with a group's own number of steps and coefficients."""
    ours, theirs = matrices(0), [p.clone() for p in matrices(0)]
    settings = dict(lr=0.05, weight_decay=0.1, momentum=0.9, nesterov=nesterov, adjust_lr_fn=adjust, **iteration)
    mine, ref = MuonNS(ours, ns_dtype=torch.bfloat16, **settings), torch.optim.Muon(theirs, **settings)
    for seed in (1, 2, 3):
        set_grads(ours, matrices(seed))
        set_grads(theirs, matrices(seed))
        mine.step()
        ref.step()
    for a, b in zip(ours, theirs):
        assert_close(a, b, rtol=0, atol=0)
        assert_close(mine.state[a]["momentum_buffer"], ref.state[b]["momentum_buffer"], rtol=0, atol=0)


def test_newton_schulz_in_float32_lands_nearer_the_float64_iteration_than_bfloat16():
    """The same five steps in float64 are the reference: float32 agrees with them to float32's
    rounding, bfloat16 to bfloat16's (some hundredths), so float32 is the more exact of the two."""
    coefficients = torch.optim.Muon([torch.zeros(2, 2)]).param_groups[0]["ns_coefficients"]
    for g in matrices(4):
        exact = newton_schulz(g.double(), coefficients, 5, 1e-7, torch.float64)
        fp32 = newton_schulz(g, coefficients, 5, 1e-7, torch.float32)
        bf16 = newton_schulz(g, coefficients, 5, 1e-7, torch.bfloat16)
        assert fp32.dtype == torch.float32 and fp32.shape == g.shape
        assert_close(fp32.double(), exact, rtol=1e-5, atol=1e-5)
        assert (bf16.double() - exact).abs().max() > 100 * (fp32.double() - exact).abs().max()


def test_muon_ns_leaves_the_momentum_buffer_as_momentum_made_it():
    """Without Nesterov the update is the momentum buffer itself, and in float32 .to() returns it
    uncopied: the iteration must not normalise it in place. After one step the buffer is (1 - beta) g."""
    (p,), (grad,) = matrices(5)[:1], matrices(6)[:1]
    opt = MuonNS([p], ns_dtype=torch.float32, lr=0.01, momentum=0.9, nesterov=False)
    p.grad = grad.clone()
    opt.step()
    assert_close(opt.state[p]["momentum_buffer"], 0.1 * grad, rtol=1e-6, atol=0)


@pytest.mark.parametrize("ns_dtype,kind", [("bfloat16", torch.optim.Muon), ("float32", MuonNS)])
def test_muon_ns_dtype_picks_torchs_optimizer_or_the_float32_one(ns_dtype, kind):
    """The default is torch.optim.Muon itself; float32 builds MuonNS with everything else the same."""
    opt = build_optimizer(GPT(tiny_config()), TrainConfig(optimizer="muon", muon_ns_dtype=ns_dtype))
    assert type(opt.muon) is kind
    assert getattr(opt.muon, "ns_dtype", torch.bfloat16) == getattr(torch, ns_dtype)
    reference = build_optimizer(GPT(tiny_config()), MUON).muon.param_groups[0]
    assert {k: v for k, v in opt.muon.param_groups[0].items() if k != "params"} == \
        {k: v for k, v in reference.items() if k != "params"}


def test_zero_grad_and_state_dict_cover_both_optimizers():
    model = GPT(tiny_config())
    opt = build_optimizer(model, MUON)
    set_grads(model.parameters(), random_grads(model, 0))
    opt.step()
    state = opt.state_dict()
    assert set(state) == {"adamw", "muon"}
    assert all("momentum_buffer" in s for s in state["muon"]["state"].values())
    opt.zero_grad()
    assert all(p.grad is None for p in model.parameters())
    again = build_optimizer(model, MUON)
    again.load_state_dict(state)
    for a, b in zip(opt.muon.state.values(), again.muon.state.values()):
        assert torch.equal(a["momentum_buffer"], b["momentum_buffer"])


def test_a_resume_keeps_its_own_group_settings():
    """The checkpoint supplies the moments; the run's config supplies momentum, lr_scale, weight decay."""
    model = GPT(tiny_config())
    old = build_optimizer(model, TrainConfig(optimizer="muon", muon_momentum=0.9, weight_decay=0.2))
    set_grads(model.parameters(), random_grads(model, 0))
    old.step()
    cfg = TrainConfig(optimizer="muon", muon_momentum=0.8, muon_lr=0.05, weight_decay=0.0)
    new = build_optimizer(model, cfg)
    load_optimizer_state(new, old.state_dict())
    muon_group = new.muon.param_groups[0]
    assert (muon_group["momentum"], muon_group["weight_decay"]) == (0.8, 0.0)
    assert muon_group["lr_scale"] == cfg.muon_lr / cfg.learning_rate
    buffers = [(new.muon.state[p], old.muon.state[p]) for p in hidden_matrices(model)]
    assert buffers and all(torch.equal(a["momentum_buffer"], b["momentum_buffer"]) for a, b in buffers)


# ------------------------------------------------------------------ in the Trainer

def trainer_args(data_dir, tmp_path, *extra):
    return once(*TINY_TRAIN_ARGS, f"--data_dir={data_dir}", f"--out_dir={tmp_path / 'run'}", "--max_iters=4",
                "--eval_interval=4", *extra)


def test_the_schedule_scales_both_groups(small_data, tmp_path):
    """Each group runs at the schedule's value times its lr_scale: Muon's peaks at muon_lr and ends at
    min_lr's fraction of it, AdamW's is the schedule's own."""
    cfg = load_config(trainer_args(small_data, tmp_path, "--optimizer=muon", "--muon_lr=0.04", "--max_iters=20"))
    trainer = Trainer(cfg)
    for it in (0, cfg.warmup_iters, cfg.max_iters - 1):
        lr = lr_at(it, cfg)
        trainer.step(lr)
        assert [g["lr"] for g in trainer.optimizer.adamw.param_groups] == [lr, lr]
        assert trainer.optimizer.muon.param_groups[0]["lr"] == pytest.approx(lr * 0.04 / cfg.learning_rate)
    assert lr_at(cfg.warmup_iters, cfg) * 0.04 / cfg.learning_rate == pytest.approx(0.04)
    assert lr_at(10 ** 6, cfg) * 0.04 / cfg.learning_rate == pytest.approx(cfg.min_lr / cfg.learning_rate * 0.04)


def test_a_muon_run_splits_qkv_so_muon_orthogonalizes_each(small_data, tmp_path):
    """TrainConfig.model_config resolves split_qkv none to true under muon: q, k and v are three
    matrices, each orthogonalized on its own (a fused (3C, C) matrix would be orthogonalized as one)."""
    trainer = Trainer(load_config(trainer_args(small_data, tmp_path, "--optimizer=muon")))
    routed = {id(p) for p in trainer.optimizer.muon.param_groups[0]["params"]}
    for block in trainer.model.blocks:
        assert {id(block.sa.q.weight), id(block.sa.k.weight), id(block.sa.v.weight)} <= routed


def test_float16_loss_scaler_unscales_and_skips_both_optimizers(small_data, tmp_path):
    """GradScaler reads the wrapper's param_groups to unscale, and skips the whole step (Muon and AdamW)
    when a gradient is not finite: the 2nd forward's NaN loss leaves every weight as it was."""
    args = trainer_args(small_data, tmp_path, "--optimizer=muon", "--dtype=float16")
    trainer = Trainer(load_config(args), wrap_model=lambda m: NaNAfter(m, 2))
    assert trainer.scaler.is_enabled()
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.step(1e-3)
    moved = [p.detach().clone() for p in trainer.model.parameters()]
    assert all(not torch.equal(a, b) for a, b in zip(before, moved) if a.dim() == 2)  # Muon and AdamW both stepped
    scale = trainer.scaler.get_scale()
    trainer.step(1e-3)
    assert all(torch.equal(a, p) for a, p in zip(moved, trainer.model.parameters()))
    assert trainer.scaler.get_scale() == scale / 2 and trainer.state.scaler_skipped_steps == 1


def test_qk_clip_runs_after_the_update_and_after_step(small_data, tmp_path, monkeypatch):
    """The call site: tracking is switched on once, and each step calls qk_clip(tau, the tracked maxima)
    after the optimizer step and after model.after_step; the heads whose max logit passed tau are counted."""
    calls, peaks = [], torch.tensor([[31.0, 29.0], [32.0, 0.0]])  # (n_layer, n_head)
    monkeypatch.setattr(GPT, "track_max_logits", lambda self, on: calls.append(("track", on)))
    monkeypatch.setattr(GPT, "tracked_max_logits", lambda self: peaks.clone())
    monkeypatch.setattr(GPT, "qk_clip", lambda self, tau, m: calls.append(("clip", tau, m.tolist())) or m)
    monkeypatch.setattr(GPT, "after_step", lambda self: calls.append(("after_step",)))
    trainer = Trainer(load_config(trainer_args(small_data, tmp_path, "--qk_clip_tau=30")))
    assert ("track", True) in calls
    step = trainer.optimizer.step
    monkeypatch.setattr(trainer.optimizer, "step", lambda: calls.append(("step",)) or step())
    calls.clear()
    trainer.step(1e-3)
    assert calls == [("step",), ("after_step",), ("clip", 30.0, peaks.tolist())]
    assert trainer._step.clipped_heads.item() == 2


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
@pytest.mark.slow
def test_qk_clip_bounds_the_logits_the_next_forward_sees(small_data, tmp_path, optimizer):
    """With a tau far below the initial logits every head is clipped at the first step, the count is in
    the metrics rows, and after a clip the largest logit on the same batch is at most about tau."""
    args = trainer_args(small_data, tmp_path, f"--optimizer={optimizer}", "--qk_clip_tau=1e-4", "--max_iters=2",
                        "--eval_interval=2", "--log_interval=1")
    trainer = Trainer(load_config(args))
    trainer.train()
    rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    n_heads = trainer.model_cfg.n_layer * trainer.model_cfg.n_head
    clipped = [r["qk_clipped_heads"] for r in rows if r["iter"] > 0]
    assert clipped[0] == n_heads and all(0 <= c <= n_heads for c in clipped)  # later steps start clipped
    x, y = trainer.state.sampler.next_batch()
    trainer.model(x, y)  # training mode: tracked
    peaks = trainer.model.tracked_max_logits()
    trainer.model.qk_clip(1e-4)  # clipped on its own batch: at most tau now
    trainer.model(x, y)
    assert trainer.model.tracked_max_logits().max().item() <= 1e-4 * (1 + 1e-3) < peaks.max().item()


# ------------------------------------------------------------------ refusals

def refusal(**keys) -> list[str]:
    with pytest.raises(BabyGPTError) as e:
        TrainConfig(**keys)
    return e.value.problems


SPHERE = [p for p, c in PLACEMENT_CLASSES.items() if c.on_sphere]


@pytest.mark.parametrize("placement", SPHERE)
def test_the_sphere_placements_refuse_muon(placement):
    model = GPTConfig(norm_placement=placement, norm_type="none", bias=False)
    problems = refusal(model=model, weight_decay=0.0, optimizer="muon")
    assert len(problems) == 1 and "\n" not in problems[0]
    assert "set optimizer adamw" in problems[0] and placement in problems[0]


@pytest.mark.parametrize("model", [GPTConfig(qk_norm=True), GPTConfig(norm_placement="hybrid"),
                                   GPTConfig(norm_placement="ngpt", norm_type="none", bias=False)],
                         ids=["qk_norm", "hybrid", "ngpt"])
def test_qk_clip_is_refused_where_a_norm_undoes_it(model):
    (problem,) = refusal(model=model, weight_decay=0.0, qk_clip_tau=50.0)
    assert problem.startswith("qk_clip_tau 50: ") and "\n" not in problem and "qk_clip_tau 0" in problem


def test_muon_lr_times_weight_decay_must_stay_below_one():
    problems = refusal(optimizer="muon", muon_lr=20.0, weight_decay=0.1)
    assert problems == [problems[0]] and "muon_lr x weight_decay" in problems[0] and "lower one" in problems[0]
    assert "muon_lr x weight_decay" not in " ".join(refusal(optimizer="adamw", muon_lr=20.0, weight_decay=0.1))


def test_muon_options_set_under_adamw_are_refused_in_one_line():
    """As rope_base under pos learned: a muon_* key that would change nothing is refused, naming the fix;
    left at their defaults they are no problem, and adamw builds AdamW alone."""
    with pytest.raises(BabyGPTError) as e:
        TrainConfig(muon_lr=0.5, muon_momentum=0.5, muon_adjust_lr="original", muon_ns_dtype="float32")
    (line,) = e.value.problems
    assert line.startswith("muon_lr 0.5, muon_momentum 0.5, muon_adjust_lr 'original', muon_ns_dtype 'float32': ")
    assert "set optimizer muon" in line
    assert TrainConfig(optimizer="muon", muon_lr=0.5).problems() == []
    assert type(build_optimizer(GPT(tiny_config()), TrainConfig())) is torch.optim.AdamW


@pytest.mark.parametrize("saved,asked", [("adamw", "muon"), ("muon", "adamw"), (None, "muon")])
def test_a_checkpoint_of_another_optimizer_is_refused(saved, asked):
    ckpt = {"config": {} if saved is None else {"optimizer": saved}}  # None: from before the key existed
    with pytest.raises(BabyGPTError) as e:
        check_same_start(ckpt, {"optimizer": asked}, "ckpt.pt")
    (line,) = e.value.problems
    assert f"optimizer {saved or 'adamw'!r} there, {asked!r} here" in line and "start a new --out_dir" in line
    assert f"resume with --optimizer={saved or 'adamw'}" in line
    check_same_start(ckpt, {"optimizer": saved or "adamw"}, "ckpt.pt")


@pytest.mark.parametrize("key", list(FIXED_AT_START))
def test_every_setting_fixed_at_the_start_is_refused_when_a_resume_changes_it(key):
    saved = {"optimizer": "muon", "decay_norms": True, "seed": 7, "ema_decay": 0.9}
    asked = {"optimizer": "adamw", "decay_norms": False, "seed": 8, "ema_decay": 0.0}
    ckpt = {"config": saved}
    with pytest.raises(BabyGPTError) as e:
        check_same_start(ckpt, {**saved, key: asked[key]}, "ckpt.pt")
    (line,) = e.value.problems
    assert f"{key} {saved[key]!r} there, {asked[key]!r} here: {FIXED_AT_START[key][0]}" in line
    assert f"resume with --{key}={saved[key]}" in line
    check_same_start(ckpt, saved, "ckpt.pt")
    check_same_start({"config": {}}, {"seed": 8}, "ckpt.pt")  # a seed not recorded is not checked


@pytest.mark.slow
def test_resuming_an_adamw_run_with_muon_is_one_line(small_data, tmp_path, capsys):
    args = trainer_args(small_data, tmp_path, "--max_iters=2", "--eval_interval=2")
    cli.run(cli.train_main, args)
    assert_refused_in_process(cli.train_main, once(*args, "--max_iters=4", "--init_from=resume", "--optimizer=muon"),
                              capsys, "optimizer 'adamw' there, 'muon' here")


@pytest.mark.slow
@pytest.mark.parametrize("change", ["--seed=5", "--decay_norms=true"])
def test_a_resume_that_changes_the_seed_or_decay_norms_is_refused_by_name(small_data, tmp_path, capsys, change):
    """Before, a new seed was accepted and changed nothing, and decay_norms was reported as a damaged checkpoint."""
    args = trainer_args(small_data, tmp_path, "--max_iters=2", "--eval_interval=2")
    cli.run(cli.train_main, args)
    key = change[2:].partition("=")[0]
    assert_refused_in_process(cli.train_main, once(*args, "--max_iters=4", "--init_from=resume", change),
                              capsys, f"{key} ", "there", "here", f"resume with --{key}=")


def test_muon_with_adamw_step_takes_no_closure():
    opt = build_optimizer(GPT(tiny_config()), MUON)
    with pytest.raises(ValueError):
        opt.step(lambda: 0.0)


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_decay_norms_decays_every_norm_parameter_and_an_offset_gain_moves_towards_one(optimizer):
    """decay_norms moves the norms' parameters (and only those) into the decayed AdamW group; with
    norm_gain_offset a step with zero gradients then shrinks w, so gamma = 1 + w moves towards 1."""
    from babygpt.norms import Norm

    cfg = TrainConfig(optimizer=optimizer, decay_norms=True, weight_decay=0.5, learning_rate=0.1, min_lr=0.01)
    model = GPT(tiny_config(norm_type="layernorm", norm_gain_offset=True, split_qkv=optimizer == "muon"))
    opt = build_optimizer(model, cfg)
    adamw = opt if optimizer == "adamw" else opt.adamw
    decay, no_decay = ({id(p) for p in g["params"]} for g in adamw.param_groups)
    norms = {id(p) for m in model.modules() if isinstance(m, Norm) for p in m.parameters(recurse=False)}
    assert norms and norms <= decay and not norms & no_decay
    plain = build_optimizer(model, TrainConfig(optimizer=optimizer))
    plain_adamw = plain if optimizer == "adamw" else plain.adamw
    assert {id(p) for p in plain_adamw.param_groups[0]["params"]} == decay - norms
    gain = model.ln_f.weight
    with torch.no_grad():
        gain.fill_(0.5)  # gamma = 1.5
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    assert_close(gain, torch.full_like(gain, 0.5 * (1 - 0.1 * 0.5)))  # decoupled decay: w (1 - lr wd)


@pytest.mark.parametrize("slowdown,warned", [(40.0, True), (0.5, False)])
def test_muon_warns_where_the_cpu_emulates_bfloat16(slowdown, warned, monkeypatch, capsys):
    """torch.optim.Muon orthogonalizes in bfloat16: where this CPU emulates it (a bfloat16 matmul many
    times slower than float32), a muon run says so as it starts; where bfloat16 is native it says nothing."""
    from babygpt import runtime, trainer

    monkeypatch.setattr(runtime, "matmul_slowdown", lambda device_type, dtype: slowdown)
    cfg = TrainConfig(optimizer="muon", device="cpu", dtype="float32")
    trainer.announce(cfg, torch.device("cpu"), trainer.distributed.Dist(), 1000, None, None, "ckpt.pt")
    err = capsys.readouterr().err
    assert ("warning: optimizer muon: torch.optim.Muon orthogonalizes each update in bfloat16, which this CPU "
            "emulates (matmul 40x slower than float32)" in err) == warned
    assert ("--muon_ns_dtype=float32 runs the same iteration in float32" in err) == warned  # the way out
    assert runtime.muon_note(torch.device("cuda"), "bfloat16") is None  # a GPU computes bfloat16 natively
    assert runtime.muon_note(torch.device("cpu"), "float32") is None  # taken: nothing left to warn of


@pytest.mark.parametrize("model,train,fragment", [
    ({}, {"weight_decay": 0.0}, "by weight_decay, which is 0"),
    ({"norm_type": "none"}, {}, "norm_type none has no parameters"),
    ({"norm_type": "rmsnorm_noparam"}, {}, "norm_type rmsnorm_noparam has no parameters"),
])
def test_decay_norms_that_would_decay_nothing_is_refused(model, train, fragment):
    """Used or refused: with nothing to decay, decay_norms would be accepted and change nothing."""
    from babygpt.errors import BabyGPTError

    with pytest.raises(BabyGPTError, match=f"decay_norms decays the norms' parameters.*{fragment}|{fragment}"):
        TrainConfig(model=tiny_config(**model), decay_norms=True, **train)
    TrainConfig(model=tiny_config(norm_type="layernorm"), decay_norms=True)  # a norm with a gain: fine

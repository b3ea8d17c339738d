"""Reinforcement-learning policies as stable-baselines3 trains and runs them (found testing outward).

A PPO policy's constructor takes gymnasium spaces and a learning-rate schedule, its ``predict``
takes a numpy observation and returns numpy actions, and SAC's ``learn`` calls its actor and
critics (not the policy) through methods of their own. Each was unrecorded or not rebuilt: the
spaces and schedules had no codec, numpy arrays had none either. Captured here while ``learn`` runs
and while ``predict`` is called, at the library's defaults (small rollouts), and replayed in a
fresh process.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from child_process import replay_in_fresh_process

import modulelens

sb3 = pytest.importorskip("stable_baselines3")
gymnasium = pytest.importorskip("gymnasium")


def _capture(model: object, targets: list[str], repo: Path, name: str, job: object, calls: int = 2) -> dict[str, str]:
    with warnings.catch_warnings():
        warnings.simplefilter("error", modulelens.CaptureWarning)  # nothing dropped, nothing unrecorded
        with modulelens.capture(model, targets, repo=repo, name=name,  # type: ignore[arg-type]
                                record=modulelens.Recording(max_calls=calls)) as cap:
            job()  # type: ignore[operator]
    return {v.name: v.ref for v in cap.saved}


def test_a_ppo_policy_is_captured_while_it_learns_and_predicts(tmp_path: Path) -> None:
    torch.manual_seed(0)
    with modulelens.track_init():
        agent = sb3.PPO("MlpPolicy", "CartPole-v1", n_steps=32, batch_size=16, n_epochs=1, seed=0, device="cpu")
    policy = agent.policy
    repo = tmp_path / "repo"
    refs = _capture(policy, ["", ":evaluate_actions", "mlp_extractor"], repo, "ppo",
                    lambda: agent.learn(total_timesteps=64))
    observation, _ = agent.env.envs[0].reset(seed=1) if hasattr(agent.env, "envs") else (None, None)
    refs |= _capture(policy, [":predict"], repo, "ppo-run", lambda: policy.predict(observation, deterministic=True))
    assert sorted(refs) == ["ppo", "ppo-run.predict", "ppo.evaluate_actions", "ppo/mlp_extractor"]
    predict = modulelens.load(refs["ppo-run.predict"], repo=repo)
    actions, state = predict.calls[0].output
    assert type(actions).__module__ == "numpy" and state is None
    results = replay_in_fresh_process(repo, refs)
    assert {label: (r["status"], r["mode"]) for label, r in results.items()} == dict.fromkeys(
        refs, ("PASS", "bit-exact")), {label: r.get("report", r.get("error")) for label, r in results.items()}


def test_sac_actor_and_critic_are_captured_while_it_learns(tmp_path: Path) -> None:
    torch.manual_seed(0)
    with modulelens.track_init():
        agent = sb3.SAC("MlpPolicy", "Pendulum-v1", learning_starts=16, batch_size=16, buffer_size=200, seed=0,
                        device="cpu")
    repo = tmp_path / "repo"
    refs = _capture(agent.policy, ["actor", "actor:action_log_prob", "critic"], repo, "sac",
                    lambda: agent.learn(total_timesteps=40))
    assert sorted(refs) == ["sac/actor", "sac/actor.action_log_prob", "sac/critic"]
    results = replay_in_fresh_process(repo, refs)
    assert {label: (r["status"], r["mode"]) for label, r in results.items()} == dict.fromkeys(
        refs, ("PASS", "bit-exact")), {label: r.get("report", r.get("error")) for label, r in results.items()}


class SpacePolicy(torch.nn.Module):
    """Built from a space, as stable-baselines3's policies and feature extractors are."""

    def __init__(self, space: object) -> None:
        super().__init__()
        self.space = space
        self.lin = torch.nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)


@pytest.mark.parametrize("kind", ["Box", "Discrete", "MultiDiscrete", "MultiBinary", "Dict", "Tuple"])
def test_every_gymnasium_space_rebuilds_as_the_space_it_was(tmp_path: Path, kind: str) -> None:
    import numpy as np
    from gymnasium import spaces

    box = spaces.Box(low=np.array([-1.0, 0.0], dtype=np.float32), high=np.array([1.0, np.inf], dtype=np.float32))
    space = {"Box": box, "Discrete": spaces.Discrete(5, start=-2),
             "MultiDiscrete": spaces.MultiDiscrete([3, 4], start=[1, 0]), "MultiBinary": spaces.MultiBinary([2, 3]),
             "Dict": spaces.Dict({"position": box, "gear": spaces.Discrete(3)}),
             "Tuple": spaces.Tuple((box, spaces.MultiBinary(4)))}[kind]
    with modulelens.track_init():
        model = SpacePolicy(space)
    refs = _capture(model, [""], tmp_path / "repo", "p", lambda: model(torch.randn(1, 2)), calls=1)
    rebuilt = modulelens.load(refs["p"], repo=tmp_path / "repo").module.space
    assert type(rebuilt) is type(space) and rebuilt == space

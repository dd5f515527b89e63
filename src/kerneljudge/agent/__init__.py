"""The episode runner: drive a model on an OpenAI-compatible server through the environment.

::

    from kerneljudge.agent import RunnerConfig, run_episode
    from kerneljudge.env import EnvConfig

    runner = RunnerConfig(model="Qwen/Qwen3-32B", base_url="http://127.0.0.1:8000/v1")
    summary = run_episode("causal_gqa", runner, EnvConfig(), out_dir="episodes")

Talking to a server needs the ``[agent]`` extra (the ``openai`` package): without it,
:func:`run_episode` and :mod:`kerneljudge.agent.client` fail with the one line
``install kerneljudge[agent]``. Transcripts and :func:`replay` need nothing beyond the judge, so
a recorded episode can be re-judged on a machine without ``openai``.
"""

from kerneljudge.agent.config import RunnerConfig
from kerneljudge.agent.replay import replay
from kerneljudge.agent.runner import run_episode
from kerneljudge.agent.runs import resume_episodes, run_episodes
from kerneljudge.agent.transcript import (
    TRANSCRIPT_VERSION,
    EpisodeSummary,
    TranscriptWriter,
    read_transcript,
    recorded_turns,
    write_transcript_from_calls,
)

__all__ = [
    "TRANSCRIPT_VERSION",
    "EpisodeSummary",
    "RunnerConfig",
    "TranscriptWriter",
    "read_transcript",
    "recorded_turns",
    "replay",
    "resume_episodes",
    "run_episode",
    "run_episodes",
    "write_transcript_from_calls",
]

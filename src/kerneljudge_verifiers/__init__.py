"""kerneljudge's verifiers plugin, under a top-level name: verifiers resolves a plugin id
(``vf-eval kerneljudge_verifiers``) by importing a top-level module. Everything lives in
:mod:`kerneljudge.integrations.verifiers`."""

from kerneljudge.integrations.verifiers import (
    KernelHarness,
    KernelTaskset,
    load_environment,
)

__all__ = ["KernelHarness", "KernelTaskset", "load_environment"]

"""The command line: ``kerneljudge`` and its subcommands.

:mod:`kerneljudge.cli.app` is the root (``eval``, ``build``, ``problems``, ``examples``, and the
subcommands each part registers: ``lint`` from :mod:`kerneljudge.lint.cli`, ``episode`` from
:mod:`kerneljudge.agent.cli`, ``suite``/``results``/``report`` from :mod:`kerneljudge.suite.cli`);
:mod:`kerneljudge.cli.output` prints tables and progress, plain when not on a terminal;
:mod:`kerneljudge.cli.examples` judges the bundled examples (``kerneljudge examples``).
"""

"""The judge service: ``kerneljudge serve`` (FastAPI + uvicorn) in front of an executor, with a
durable job queue and results in SQLite, and its clients.

:mod:`~kerneljudge.service.store` the queue and results (SQLite), :mod:`~kerneljudge.service.core`
admission and the dispatcher, :mod:`~kerneljudge.service.app` the HTTP endpoints,
:mod:`~kerneljudge.service.client` :class:`JudgeClient` and :class:`AsyncJudgeClient`,
:mod:`~kerneljudge.service.cli` the ``serve`` command. FastAPI, uvicorn and httpx are the
``serve`` extra: ``pip install 'kerneljudge[serve]'``. This module imports none of them.
"""

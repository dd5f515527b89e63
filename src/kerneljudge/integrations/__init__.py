"""kerneljudge's environment inside other frameworks, each behind an optional extra.

- :mod:`kerneljudge.integrations.verifiers`: ``load_environment(...)``, a ``verifiers``
  environment (extra ``[verifiers]``).
- :mod:`kerneljudge.integrations.inspect`: ``kernel_task``, an Inspect AI task (extra
  ``[inspect]``).

Importing this package needs neither; importing a module without its package raises
:class:`~kerneljudge.integrations._common.MissingExtraError` with one line naming the extra.
See ``docs/integrations.md``.
"""

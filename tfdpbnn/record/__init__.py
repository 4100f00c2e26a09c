"""The privacy record: phase ledger, per-record ledger, run record, store, releases, statement.

The DP step writes the record (``tfdpbnn.optimizers`` calls into it); everything else (callbacks, export,
the CLI, the audits) reads it. This package imports no optimizer, callback, uncertainty, audit or command
module: it depends only on ``tfdpbnn.privacy`` (accountants, budget, the RDP orders and conversion of a
private search's curve), ``tfdpbnn._validation`` and ``tfdpbnn._private_api``. Every private attribute it
keeps on optimizers, models, layers and tf.data pipelines is read and written through ``attributes``. See
docs/architecture.md for its modules.
"""

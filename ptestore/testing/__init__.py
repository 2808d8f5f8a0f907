"""Test kit shipped with ptestore: the writer contract suite and an S3 test server.

Third-party writers run the contract by subclassing
:class:`ptestore.testing.writer_contract.WriterContract` (a pytest mixin).
"""

from __future__ import annotations

__all__ = ["writer_contract"]

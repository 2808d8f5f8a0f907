"""Test kit shipped with ptestore: the writer contract suite and two S3 test servers
(moto, SeaweedFS).

Third-party writers run the contract by subclassing
:class:`ptestore.testing.writer_contract.WriterContract` (a pytest mixin).
"""

from __future__ import annotations

__all__ = ["moto", "s3server", "seaweedfs", "writer_contract"]

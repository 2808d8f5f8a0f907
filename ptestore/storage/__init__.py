"""Storage: the types every layer shares, and the loaders.

- :mod:`.types`: the :class:`~ptestore.storage.types.DataLoader` protocol, the
  ``Buffer`` alias, :func:`~ptestore.storage.types.split_url` and
  :func:`~ptestore.storage.types.strerror`; imports nothing but the standard library,
  so ``format/``, ``writers/`` and ``provenance/`` take their types from here;
- :mod:`.loaders`: the loader implementations and ``open_loader`` (imports fsspec);
- :mod:`.routing`: which storage option goes to which side (loader or writer);
- :mod:`._options`: option names and value types checked at the edge;
- :mod:`._s3source`: an S3 object as a server-side copy source.

This package's ``__init__`` imports nothing, so importing :mod:`.types` stays cheap.
"""

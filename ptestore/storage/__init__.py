"""Storage: the types every layer shares, and the loaders.

- :mod:`.types`: the :class:`~ptestore.storage.types.DataLoader` protocol, the
  ``Buffer`` alias, :func:`~ptestore.storage.types.split_url` and
  :func:`~ptestore.storage.types.strerror`; imports nothing but the standard library,
  so ``format/``, ``writers/`` and ``provenance/`` take their types from here;
  :class:`~ptestore.storage.types.StorageURL`: THE classification of a path or URL
  (local or not, its path, its protocol);
- :mod:`.schemes`: the scheme table (protocol -> loader and writer classes by name,
  imported on first use, and the extra to install when a package is missing);
- :mod:`.atomic`: small files written atomically (``put_bytes``/``get_bytes``) and the
  durability primitives (``sync_file``, ``sync_directory``, ``rename``);
- :mod:`.loaders`: the loader implementations and ``open_loader`` (imports fsspec);
- :mod:`.routing`: which storage option goes to which side (loader or writer);
- :mod:`._options`: option names and value types checked at the edge;
- :mod:`._s3source`: an S3 object as a server-side copy source.

This package's ``__init__`` imports nothing, so importing :mod:`.types` stays cheap.
"""

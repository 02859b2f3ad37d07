"""Vector search behind one interface (store.py), with the numpy backend (exact, in process, the default)
and the Milvus backend (a server, a cluster or Milvus Lite), chosen by MNEMO_VECTOR_STORE (config.py);
the process's store is current.vector_store(). The settings import config.py through this package, so it
imports nothing itself: numpy loaded that early would miss the thread settings made before it loads."""

"""Model-provider plumbing: token counting now; the LLM client, embeddings and image token estimates later."""

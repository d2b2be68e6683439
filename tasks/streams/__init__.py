"""Redis: keys and the client, request streams and their readers, cancel flags, worker leases and published stats."""

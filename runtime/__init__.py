"""Everything that runs inside a rank: config, protocol, coordinator, hybrid worker."""

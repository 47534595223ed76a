"""Operations: launcher, admin CLI, signing, verified loads, model control, warm-up, golden."""

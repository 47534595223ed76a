"""The dispatch domain, free of serving: window validation, geo, pair features, resolver."""

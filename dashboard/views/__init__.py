"""One module per dashboard page; each has `render(store, identity)`."""

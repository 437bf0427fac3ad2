"""The data-parallel strategies, one module each, named as the registry names them."""

"""The tests of the Order/Inventory example service (``examples/order_inventory``)."""

"""Running dpfl beyond one process: a Ray cluster and a Flower federation.

Each integration is an optional extra (``pip install 'dpfl[ray]'``,
``pip install 'dpfl[flower]'``) and is imported only when used; nothing in
:mod:`dpfl.accounting` or :mod:`dpfl.sim` imports them.
"""

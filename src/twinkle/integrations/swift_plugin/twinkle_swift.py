"""ms-swift's ``--external_plugins`` file for twinkle: makes ``--callbacks twinkle``
observe the training (:func:`twinkle.integrations.swift.register`). Its path:
``twinkle swift-plugin``."""

from twinkle.integrations.swift import register

register()

"""The API-serving core: any API group served the way kube-apiserver serves one, written once.

Declare a group version as data (:class:`~.model.GroupVersion` of
:class:`~.model.ResourceSpec`: names, scope, verbs, the ``openAPIV3Schema``, printer columns,
field-selector paths, subresources; :func:`~.model.from_crd` takes them from a CRD dict for a
view of stored objects), back each resource with a :class:`~.model.Provider`
(``objects()``, ``changes()``, ``write()``, ``delete()``, ``subresource()``; optionally
``version()``, :class:`~.model.Versioned`), and hand both to
:class:`~.server.ApiServer`; the caller authenticates, authorizes what
:meth:`~.server.ApiServer.route` returns, then calls :meth:`~.server.ApiServer.serve`,
:meth:`~.server.ApiServer.discovery` or :meth:`~.server.ApiServer.openapi`.

What every served resource then gets, each decision a pure function with its own tests:

- discovery v1 and v2 aggregated (:mod:`.discovery`); OpenAPI v2 and v3 from the schemas
  (:mod:`.openapi`);
- label and field selectors (:mod:`.selectors`), ``limit``/``continue`` and resourceVersion
  semantics for list and watch, ``sendInitialEvents``, bookmarks (:mod:`.listing`) over a
  versioned cache with a bounded history (:mod:`.store`);
- which resource request a path and method are (:mod:`.routing`);
- Tables for lists, gets and watches (:mod:`.tables`);
- JSON, merge and strategic merge patches (:mod:`.patching`), server-side apply with managed
  fields (:mod:`.ssa`), optimistic concurrency and identity checks on every write
  (:mod:`.writes`), ``fieldValidation`` (:mod:`.validation`);
- ``metav1.Status`` errors with ``details`` (:mod:`.failures`).
"""

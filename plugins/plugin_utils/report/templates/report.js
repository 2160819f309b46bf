// "only hosts that need attention": hide the rows (and whole nodes) where everything is fine.
(function () {
  var box = document.getElementById('only-problems');
  if (!box) return;
  function apply() { document.body.classList.toggle('only-problems', box.checked); }
  box.addEventListener('change', apply);
  apply();
})();

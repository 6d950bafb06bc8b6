// The ipywidgets HTML manager calls MathJax 2's MathJax.Hub.Queue(["Typeset", hub, element]);
// the book serves MathJax 3. Forward such calls to MathJax 3's typesetPromise.
(function () {
  if (!window.MathJax || window.MathJax.Hub) { return; }
  window.MathJax.Hub = {
    Queue: function () {
      var elements = [];
      for (var i = 0; i < arguments.length; i++) {
        var job = arguments[i];
        if (Array.isArray(job) && job[0] === "Typeset" && job[2]) { elements.push(job[2]); }
      }
      if (elements.length && window.MathJax.typesetPromise) {
        return window.MathJax.typesetPromise(elements);
      }
    },
    Config: function () {},
  };
})();
